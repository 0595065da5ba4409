"""What operators do, combined (tests/deploy/operator_faults.py, played by cluster_faults.py
under publish load): a roll the HPA scales in under, pods SIGKILLed in the middle of their
drain, a node drain of two seeds through the PDB, a misspelt key and a bad port rolled out,
the ClusterPassword Secret changed. Each run checks that no acknowledged publish is lost,
no subscriber sees a duplicate or a position out of order, and every subscriber that moved
resumed with DATA_SYNC (rehearsal.check)."""

from __future__ import annotations

from pathlib import Path

import pytest
from test_k8s_cluster_faults import play


@pytest.mark.slow
def test_a_roll_goes_on_below_the_count_the_hpa_scaled_in_to(tmp_path: Path) -> None:
    """Pod 4 rolled and still starting when the HPA scales 5 -> 3: pods 4 and 3 leave at
    once, and the roll goes on with seed 2 (at a quarter of the timings: ~55 s at load
    ~15, most of it the five pods' first start)."""
    summary = play("roll-with-scale-in", tmp_path, time_scale="0.25")
    observed = summary["observed"]
    assert observed["rolled_pod_ready_when_scaled_in"] is False, observed
    assert observed["pods"] == [0, 1, 2]
    assert observed["seed_2_config"] == "DrainTime = 44", observed
    assert summary["unknown"] == 0


@pytest.mark.slow
def test_pods_killed_in_the_middle_of_their_drain(tmp_path: Path) -> None:
    """The Raft leader's pod and non-seed 3 deleted with a grace period that ends 0.5 s
    after SIGTERM while a client of each never answers the drain's close: both SIGKILLed
    mid-drain. Their clients resume elsewhere from their positions; a publish in flight on
    a killed member may be unknown (never wrong) -- one per publishing client at most
    (~25 s)."""
    summary = play("killed-mid-drain", tmp_path, time_scale="0.25")
    observed = summary["observed"]
    assert list(observed["exit_codes"].values()) == [-9, -9], observed
    assert summary["unknown"] <= 2, summary["unknown"]
    assert summary["subscribers_moved"] >= 1  # the one pinned to the leader, at least


@pytest.mark.slow
def test_a_node_drain_of_two_seeds_takes_one_at_a_time(tmp_path: Path) -> None:
    """Two seeds on one node (a two-node pool) drained as ``kubectl drain`` does: the PDB
    lets one go and refuses the other until the first is ready again (README, "Node
    drains", for what that readiness does not promise; at a quarter of the timings:
    ~50 s)."""
    summary = play("node-drain-two-seeds", tmp_path, time_scale="0.25")
    refused = summary["observed"]["evictions_refused"]
    assert refused["1"] == 0 and refused["0"] >= 1, refused


@pytest.mark.slow
def test_a_bad_config_rolled_out_stops_its_pod_with_one_line(tmp_path: Path) -> None:
    """A misspelt key, then a port out of range, rolled onto seed 2: each start of its pod
    exits before its startup probe passes, writing one line that names the key; seeds 0
    and 1 serve meanwhile; the rollback brings it back (at a quarter: ~30 s)."""
    summary = play("bad-config-roll", tmp_path, time_scale="0.25")
    observed = summary["observed"]
    misspelt = ("migratory: configuration error: /etc/migratory/migratory.conf:28: unknown "
                "key 'ClusterElectionTimout' (did you mean 'ClusterElectionTimeout'?)\n")
    port = ("migratory: configuration error: /etc/migratory/migratory.conf:6: Listen: must "
            "be >= 0 and <= 65535, got 88000\n")
    assert observed["crash_logs"] == [misspelt, misspelt, port], observed
    assert observed["others_ready"] is True
    assert observed["acknowledged_while_crashing"] > 0
    assert summary["unknown"] == 0


@pytest.mark.slow
def test_a_changed_cluster_password_keeps_a_restarted_pod_out(tmp_path: Path) -> None:
    """The Secret changed in place: the next pod to restart reads the new password and
    stays not ready, saying so, while the others serve; the rotation (every pod stopped,
    all started on the new password) comes back from the seeds' Raft logs (~60 s)."""
    summary = play("password-rotated", tmp_path, time_scale="0.25")
    observed = summary["observed"]
    assert not any(observed["restarted_pod_ready"]), observed
    assert "(a different ClusterPassword?)" in observed["restarted_pod_readyz"], observed
    assert observed["others_ready"] is True
    assert summary["subscribers_moved"] == summary["subscribers"]  # at 0, every one
