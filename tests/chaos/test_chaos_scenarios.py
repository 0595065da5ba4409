"""Every nemesis scenario in one real run (a hand-written list of scenarios, the seeded
single faults around them, a light load): each scenario does what it claims, as the
nemesis and cluster tables show; while the seed majority is lost (or the only seed up
to date is down, the others being empty or behind: lose-disk) no publish is
acknowledged; the Spark checker finds the run clean (the smoke test of ``make test``:
no safety violation, no member exit the runner did not cause); and every history table
is written with the schema's fields (``run_tables.py``).

A scenario that finds no Raft leader to aim at fails this test, with the member logs'
tail in the message.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import pytest
from process_tree import run_within
from run_bound import chaos_run_bound
from run_tables import check_every_table_written

from chaos.scenarios import SYNC_ATTEMPTS
from chaos.schedule import SCENARIOS, Fault, generate, to_jsonl
from spark_analysis.__main__ import main as spark_check

ROOT = Path(__file__).resolve().parents[2]
SCHEDULE = [
    Fault(4.0, "upstream-stop", "upstream-of-migratory-3", 3.0, "SIGSTOP for 3.0s"),
    Fault(7.5, "lose-disk", "migratory-1", 1.0, "alone: SIGKILL, ClusterDataDir deleted, restart"),
    Fault(10.0, "lagging-failover", "leader", 4.5,
          "follower paused 3.0s, then the leader killed for 1.5s"),
    Fault(20.0, "sync-kill", "leader", 1.5,
          "migratory-4 restarted; the leader killed for 1.5s while syncing it"),
    Fault(29.0, "majority-loss", "seeds", 6.0, "raft-cut: the Raft links of every seed held"),
    # a lost majority by kills too: the leader and both followers, one of them on an empty
    # ClusterDataDir after it, the other one behind (it was down before)
    Fault(41.0, "lose-disk", "seeds", 7.0, "leader kill for 5.5s while a follower loses its "
          "ClusterDataDir; the other follower killed 1.5s before"),
    Fault(53.0, "all-seeds-restart", "seeds", 1.5, "every seed killed for 1.5s after compaction"),
]
DURATION = 62
SEED = 3
SINGLES_SEED = 11  # the single faults: chaos.schedule.generate's, kept clear of the scenarios
MARGIN = 0.1  # s: a publish invoked this long after the majority is lost cannot commit


def rows(run: Path, table: str) -> list[dict[str, Any]]:
    return [json.loads(line) for line in (run / "history" / f"{table}.jsonl").open()]


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory, light_load: list[str]) -> Path:
    out = tmp_path_factory.mktemp("scenarios")
    schedule = out / "schedule-in.jsonl"
    schedule.write_text(to_jsonl(generate(SINGLES_SEED, DURATION, given_scenarios=SCHEDULE)))
    args = [sys.executable, "-m", "chaos", "run", "--seed", str(SEED), "--duration", str(DURATION),
            "--out", str(out / "run"), "--schedule", str(schedule), *light_load]
    code, stdout, stderr = run_within(args, chaos_run_bound(DURATION), out, says=True, cwd=ROOT)
    assert code == 0, stderr[-2000:]
    (out / "stdout.txt").write_text(stdout)
    return out / "run"


def starts(nemesis: list[dict[str, Any]], fault: str, word: str) -> list[dict[str, Any]]:
    return [n for n in nemesis if n["fault"] == fault and n["phase"] == "start"
            and word in (n["detail"] or "")]


def leader_at(cluster: list[dict[str, Any]], t: float) -> str | None:
    """The member the last sample before ``t`` showed as Raft leader."""
    before = [c for c in cluster if c["time"] < t and c["raft_state"] == "leader"]
    return before[-1]["member"] if before else None


def why(run: Path) -> str:
    logs = sorted((run / "logs").glob("*.log"))
    return "\n".join(f"{p.name}: {p.read_text()[-600:]}" for p in logs)


def test_run_applied_every_scenario(run: Path) -> None:
    faults = json.loads((run / "run.json").read_text())["faults"]
    applied = {k: n for k, n in faults["applied_by_kind"].items() if k in SCENARIOS}
    assert sum(applied.values()) == len(SCHEDULE), (faults, why(run))
    assert not set(faults["skipped_by_kind"]) & set(SCENARIOS), faults
    singles = {k: n for k, n in faults["applied_by_kind"].items() if k not in SCENARIOS}
    assert {"kill", "pause"} <= set(singles), faults


def test_run_writes_every_table(run: Path) -> None:
    check_every_table_written(
        run, seed=SEED, duration=DURATION, schedule=(run.parent / "schedule-in.jsonl").read_text(),
        crashes=0, stdout=(run.parent / "stdout.txt").read_text(),
    )


def test_the_run_is_clean(spark: Any, run: Path) -> None:
    code = spark_check([str(run)], spark=spark)
    summary = json.loads((run / "report" / "summary.json").read_text())
    violations = {
        kind: {name: n for name, n in per.items() if n}
        for kind, per in summary["violations"].items()
    }
    assert violations == {"sdk": {}, "raw": {}, "members": {}}, summary["examples"]
    assert code == 0 and summary["ok"]
    assert summary["counts"]["publishes"]["ok"] > 500
    assert (run / "report" / "report.md").exists()


def test_upstream_stop_stops_a_seed(run: Path) -> None:
    nemesis = rows(run, "nemesis")
    (pause,) = starts(nemesis, "pause", "upstream-stop")
    assert pause["target"] in {"migratory-0", "migratory-1", "migratory-2"}
    assert any(n["fault"] == "resume" and n["target"] == pause["target"] for n in nemesis)


def test_lagging_failover_kills_the_leader_as_the_follower_resumes(run: Path) -> None:
    nemesis, cluster = rows(run, "nemesis"), rows(run, "cluster")
    (pause,) = starts(nemesis, "pause", "lagging-failover")
    resume = next(n for n in nemesis if n["fault"] == "resume" and n["phase"] == "start"
                  and n["target"] == pause["target"] and n["time"] > pause["time"])
    assert resume["time"] - pause["time"] >= 2.9  # paused its 3 s (a busy box: longer)
    (kill,) = starts(nemesis, "kill", "lagging-failover")
    assert kill["detail"].startswith("leader")
    assert kill["target"] != pause["target"]
    assert 0 <= kill["time"] - resume["time"] < 0.2, "the leader dies as the follower resumes"
    assert leader_at(cluster, kill["time"]) == kill["target"], why(run)
    # resumed behind: every other seed's last sample before the resume is 2 commits past
    # the follower's last one before the stop (or the run's log says it was not)
    said = (run.parent / "stdout.txt").read_text()
    if "lagging-failover: " in said and " not behind within " in said:
        return
    stopped_at = last_sample(cluster, pause["target"], pause["time"])["applied_clsn"]
    others = {s: last_sample(cluster, s, resume["time"])["applied_clsn"]
              for s in ("migratory-0", "migratory-1", "migratory-2") if s != pause["target"]}
    assert all(c >= stopped_at + 2 for c in others.values()), (stopped_at, others)


def last_sample(cluster: list[dict[str, Any]], name: str, t: float) -> dict[str, Any]:
    return [c for c in cluster if c["member"] == name and c["time"] < t and c["up"]][-1]


def leaders_at(cluster: list[dict[str, Any]], t: float) -> set[str]:
    """The members whose last sample before ``t`` shows them as Raft leader."""
    last = {c["member"]: c for c in cluster if c["time"] < t}
    return {m for m, c in last.items() if c["raft_state"] == "leader"}


def test_sync_kill_kills_the_leader_while_it_sends_a_catch_up(run: Path) -> None:
    nemesis, cluster = rows(run, "nemesis"), rows(run, "cluster")
    # again when the leader moved during the catch-up (an election on a busy box)
    restarts = starts(nemesis, "kill", "so that it needs a cache sync")
    assert 1 <= len(restarts) <= SYNC_ATTEMPTS
    assert {r["target"] for r in restarts} == {"migratory-4"}
    (kill,) = starts(nemesis, "kill", "while it sends migratory-4")
    assert kill["time"] > restarts[-1]["time"]
    assert "KiB sent" in kill["detail"], kill
    assert int(kill["detail"].split("(")[1].split(" KiB")[0]) >= 64
    assert kill["detail"].startswith("leader, "), kill
    assert leaders_at(cluster, kill["time"]) == {kill["target"]}, why(run)


def test_a_lost_majority_acknowledges_nothing(run: Path) -> None:
    nemesis, publishes = rows(run, "nemesis"), rows(run, "publishes")
    windows = []
    cut = starts(nemesis, "blackhole", "majority-loss")
    assert {n["target"] for n in cut} == {"migratory-0", "migratory-1", "migratory-2"}
    heal = min(n["time"] for n in nemesis if n["fault"] == "blackhole" and n["phase"] == "end"
               and "majority-loss" in n["detail"])
    windows.append((max(n["time"] for n in cut), heal))
    (killed,) = starts(nemesis, "kill", "lose-disk: kill for")  # the one seed up to date
    back = min(n["time"] for n in nemesis if n["fault"] == "restart" and n["phase"] == "start"
               and n["target"] == killed["target"] and n["time"] > killed["time"])
    windows.append((killed["time"], back))
    invoke = {p["msg_id"]: p["time"] for p in publishes if p["type"] == "invoke"}
    for lo, hi in windows:
        assert hi - lo >= 5.5
        acked = [p for p in publishes if p["type"] == "ok" and p["time"] < hi
                 and invoke[p["msg_id"]] > lo + MARGIN]
        assert acked == [], f"acknowledged while the seed majority was lost: {acked[:3]}"
        invoked = {p["msg_id"] for p in publishes if p["type"] == "invoke" and lo < p["time"] < hi}
        refused = {p["msg_id"] for p in publishes if p["type"] in ("fail", "info")} & invoked
        assert len(refused) > 20, "publishes in the window must be refused or left unknown"
    # the runner's own count (run.json) agrees: three windows, nothing acknowledged inside
    counted = json.loads((run / "run.json").read_text())["majority_loss"]
    assert [w["what"].split()[0] for w in counted] == ["raft-cut:", "lose-disk:", "every"]
    assert all(w["acknowledged_inside"] == 0 and w["invoked"] > 20 for w in counted), counted


def test_lose_disk_wipes_a_seed_alone_and_while_the_leader_is_down(run: Path) -> None:
    nemesis, cluster = rows(run, "nemesis"), rows(run, "cluster")
    kills = starts(nemesis, "kill", "lose-disk")
    assert [k["target"] for k in kills[:1]] == ["migratory-1"] and "alone" in kills[0]["detail"]
    early, lead, wiped = kills[1:]
    assert "so that it lags" in early["detail"] and "leader" not in early["detail"]
    assert lead["detail"].startswith("leader, ") and leader_at(cluster, lead["time"]) == lead[
        "target"], why(run)
    assert lead["time"] - early["time"] >= 1.4  # 1.5 s before (a busy box: longer)
    assert len({early["target"], lead["target"], wiped["target"]}) == 3
    # each wiped seed's data directory held its journal, and it came back ready
    for target in ("migratory-1", wiped["target"]):
        deleted = [n for n in nemesis if n["fault"] == "kill" and n["phase"] == "end"
                   and n["target"] == target and "ClusterDataDir deleted" in n["detail"]]
        assert deleted and all(int(n["detail"].split("(")[1].split()[0]) > 0 for n in deleted)
    restarted = {n["target"] for n in nemesis if n["fault"] == "restart" and n["phase"] == "end"
                 and n["detail"] == "ready" and n["time"] > lead["time"]}
    assert {early["target"], lead["target"], wiped["target"]} <= restarted
    # the empty seed refused to vote for the one that lagged (cluster/raft_votes.py)
    log = (run / "logs" / f"{wiped['target']}.log").read_text(errors="replace")
    assert "started with an empty ClusterDataDir" in log


def test_all_seeds_restart_after_compaction(run: Path) -> None:
    nemesis = rows(run, "nemesis")
    killed = starts(nemesis, "kill", "all-seeds-restart")
    assert {n["target"] for n in killed} == {"migratory-0", "migratory-1", "migratory-2"}
    assert all("compacted on 3 of 3 seeds" in n["detail"] for n in killed), killed
    restarts = [n for n in nemesis if n["fault"] == "restart" and n["phase"] == "start"
                and n["time"] > killed[0]["time"]]
    assert {n["target"] for n in restarts} >= {"migratory-0", "migratory-1", "migratory-2"}
    # all down together: the last seed killed before the first one started again (the
    # kills' spread in seconds depends on the box, their order does not)
    assert max(n["time"] for n in killed) < min(n["time"] for n in restarts)
