"""Faults of the whole StatefulSet under publish load (tests/deploy/cluster_faults.py): every
pod deleted at once (the Raft leader's volume lost with it), a seed's volume lost while
another seed is away, a ConfigMap change the members refuse, a longer member list rolled
out, seeds rolled while cluster DNS answers with old IPs, a scale-out and -in while the
Raft leader restarts, the count set below the seeds and back, a pod at another pod's old
IP, a pod scaled away as soon as it started; and two at once (combined_faults.py): every
pod deleted twice before the first restart is ready, the Raft leader's pod deleted while
another seed starts and the set scales in. Each run checks that no acknowledged
publish is lost, no subscriber sees a duplicate or a position out of order, and every
subscriber that moved resumed with DATA_SYNC (rehearsal.check)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from namespaced import TIME_SCALE, run_namespaced


def play(scenario: str, out: Path, time_scale: str = TIME_SCALE) -> dict[str, Any]:
    result, summary = run_namespaced("cluster_faults.py", out, 100, scenario,
                                     time_scale=time_scale)
    log = "\n".join(summary["events"][-40:] + [
        f"subscriber {n}: {line}" for n, lines in summary.get("subscriber_timelines", {}).items()
        for line in lines] + [f"observed: {summary['observed']}"])
    assert summary["violations"] == [], log
    assert result.returncode == 0, log
    assert summary["data_resync"] == 0
    return summary


@pytest.mark.slow
def test_every_pod_deleted_at_once_and_back_in_another_order(tmp_path: Path) -> None:
    summary = play("whole-restart", tmp_path)
    assert summary["observed"]["volume_lost_by"] in (0, 1, 2)  # the leader's, then
    # a publish in flight when the last seed lost its majority may be unknown (never
    # wrong: lost, duplicated or reordered deliveries are violations above); each of
    # the two publishers publishes one at a time, so at most one such per outage window
    # (the deletion, the restart) each
    assert summary["unknown"] <= 4, summary["unknown"]
    # every subscriber lost its member and resumed from its position
    assert summary["subscribers_moved"] == summary["subscribers"]
    assert summary["data_sync"] >= summary["subscribers"]


@pytest.mark.slow
def test_a_seed_on_an_empty_volume_and_one_behind_do_not_elect(tmp_path: Path) -> None:
    """Seeds 1 (its volume lost) and 2 (away while the last publishes were acknowledged)
    are up without seed 0: they must wait for it. With the rule of cluster/raft_votes.py
    off (``cluster_faults.py lost-volume --plant votes-on-empty-disk``) the two became
    ready alone and 582 acknowledged publishes were lost to every subscriber."""
    summary = play("lost-volume", tmp_path)
    observed = summary["observed"]
    assert not any(observed["seeds_1_2_alone_ready"]), observed


@pytest.mark.slow
def test_a_config_change_the_seeds_refuse_stalls_at_the_first_pod(tmp_path: Path) -> None:
    """Before, the rolled seed's /readyz said only 'member is comparing cluster settings
    with the seeds', for ever: two of the five seeds it counted refused it, the three
    others do not exist, so no majority ever answered -- nothing named the setting."""
    summary = play("drift-refused", tmp_path)
    observed = summary["observed"]
    assert observed["rolled_pod_ready"] is False
    assert "2 of the 5 seeds disagree so far: ClusterSeedMemberCount differs" in observed[
        "rolled_pod_readyz"], observed
    assert observed["others_ready"] is True
    assert observed["acknowledged_while_rolled"] > 0  # the others kept serving


@pytest.mark.slow
def test_a_longer_member_list_rolls_out_pod_by_pod(tmp_path: Path) -> None:
    summary = play("members-extended", tmp_path)
    observed = summary["observed"]
    assert all(observed["half_rolled_all_ready"]), observed
    # every seed linked to the two others, old list or new
    assert [len(peers) for peers in observed["half_rolled_linked"].values()] == [2, 2, 2]
    assert summary["unknown"] == 0


@pytest.mark.slow
def test_seeds_rolled_under_a_dns_cache_keep_a_raft_majority(tmp_path: Path) -> None:
    """Cluster DNS answering a recreated seed's name with its old IP for 30 s, and the
    rollout waiting minReadySeconds (30 s) between pods (both at a quarter: most of the
    test's ~36 s is these two waits). With ``--plant no-min-ready-seconds`` the next seed
    was taken as soon as the previous was ready: no majority of the seeds ready for 3.75
    s (6.0 s at half scale, the three seeds rolled), members cut their clients off with
    1013 and 4 publish outcomes were left unknown -- a violation here."""
    summary = play("seed-roll-dns", tmp_path, time_scale="0.25")
    observed = summary["observed"]
    assert observed["min_ready_seconds"] >= observed["dns_cache_seconds"] > 0, observed
    assert summary["unknown"] == 0


@pytest.mark.slow
def test_scale_out_and_in_while_the_raft_leader_restarts(tmp_path: Path) -> None:
    """``kubectl scale`` 3 -> 7 -> 3 (Parallel: four non-seeds created, then deleted, at
    once) while the Raft leader's pod restarts during each step: two seeds stay up, so
    every publish gets a definite outcome and every moved subscriber resumes from its
    position (~15 s). One subscriber connects to the leader's pod (again after a move),
    so at least one moves (scaling_faults.LEADER_PINNED)."""
    summary = play("scale-out-in-leader-restart", tmp_path)
    assert len(summary["observed"]["restarted_seeds"]) == 2
    assert summary["unknown"] == 0
    assert summary["subscribers_moved"] >= 1  # the one pinned to the leader, at least


@pytest.mark.slow
def test_a_count_set_below_the_seeds_keeps_their_raft_logs(tmp_path: Path) -> None:
    """The StatefulSet set to 1 pod (an apply that drops a ``replicas`` field: the API's
    default) until the HPA's next sync raises it to 3, then to 0 (``kubectl scale
    --replicas=0``, stopping the cluster) and back to 3. Before, the manifest had
    ``whenScaled: Delete``: the controller deleted the claims of seeds 1 and 2, then of
    all three, and the cluster came back with new epochs -- every subscriber got
    DATA_RESYNC and saw positions go backwards, and acknowledged publishes were lost
    (at a quarter of the timings: ~25 s)."""
    summary = play("scaled-below-the-seeds", tmp_path, time_scale="0.25")
    assert summary["subscribers_moved"] == summary["subscribers"]  # at 0, every one


@pytest.mark.slow
def test_a_pod_at_another_pods_old_ip_under_a_dns_cache(tmp_path: Path) -> None:
    """Seed 1 rescheduled and non-seed 3 given its old IP while cluster DNS still answers
    ``migratory-1`` with it: members that dial seed 1 reach non-seed 3, which must not be
    taken for seed 1 (cluster links: "dialled migratory-1… but migratory-3… answered";
    Raft: the preamble's MAC names the seed it is for). Seeds 0 and 2 keep the majority
    meanwhile, and every seed links to the new seed 1 once the caches expire (at a
    quarter of the timings: ~23 s)."""
    summary = play("ip-reused", tmp_path, time_scale="0.25")
    observed = summary["observed"]
    assert [len(peers) for peers in observed["linked"].values()] == [2, 2, 2], observed
    assert summary["unknown"] == 0


@pytest.mark.slow
def test_a_pod_scaled_away_as_soon_as_it_started(tmp_path: Path) -> None:
    """The HPA flapping (or ``kubectl scale`` undone): non-seed 3 deleted as soon as its
    startup probe passes, twice (once still syncing, once just in the Service), then
    created again. Each leaves cleanly and the third syncs (~27 s)."""
    summary = play("scale-flap", tmp_path)
    assert len(summary["observed"]["ready_when_deleted"]) == 2
    assert summary["unknown"] == 0


@pytest.mark.slow
def test_every_pod_deleted_twice_before_the_first_restart_is_ready(tmp_path: Path) -> None:
    """The whole set in a crash loop (combined_faults.py): every pod deleted, recreated,
    and deleted again as soon as one has started, none ready, the first Raft leader's
    volume lost with it, then recreated; the subscribers on the client Service only
    (19-32 s: the longer runs had a member's drain wait 10 s for publishes the departed
    seeds could no longer settle, as whole-restart's do)."""
    summary = play("whole-crash-loop", tmp_path)
    observed = summary["observed"]
    assert observed["ready_when_deleted_again"] == [False] * 4, observed
    assert observed["volume_lost_by"] in (0, 1, 2)
    assert summary["unknown"] <= 6, summary["unknown"]  # as whole-restart: two publishers,
    # at most one in flight per outage window (two deletions, the restart) each; 0-4 seen
    assert summary["subscribers_moved"] == summary["subscribers"]


@pytest.mark.slow
def test_the_leader_deleted_while_a_seed_starts_and_the_set_scales_in(tmp_path: Path) -> None:
    """The Raft leader's pod deleted while another seed's new pod is still starting (not
    ready) and non-seed 3 is scaled away at once: one seed ready until they are back
    (combined_faults.py, ~16 s)."""
    summary = play("leader-away-seed-starting-scale-in", tmp_path)
    observed = summary["observed"]
    assert observed["starting_ready_when_leader_gone"] is False, observed
    assert observed["pods"] == [0, 1, 2]
    assert summary["unknown"] <= 2, summary["unknown"]  # one in flight per publisher
