"""The nemesis schedule: deterministic per seed; single faults keep to a minority of the
seeds; scenarios reach what that rule keeps away, each in a window of its own."""

from __future__ import annotations

import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest

from chaos.schedule import (
    LEAD,
    SCENARIOS,
    SCENARIOS_FROM,
    SETTLE,
    Fault,
    active_seed_faults,
    generate,
    index,
    lag_and_down,
    lose_disk_plan,
    non_seed_of,
    to_jsonl,
    touches_seeds,
)

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("seed", [0, 1, 2, 42, 1234])
def test_same_seed_same_schedule(seed: int) -> None:
    assert generate(seed, 300) == generate(seed, 300)
    assert to_jsonl(generate(seed, 60)) == to_jsonl(generate(seed, 60))


def test_different_seeds_differ() -> None:
    assert generate(1, 120) != generate(2, 120)


@pytest.mark.parametrize("members,seeds", [(5, 3), (7, 5), (3, 3)])
@pytest.mark.parametrize("seed", range(40))
def test_single_faults_minority_of_seeds_and_one_fault_per_member(
    seed: int, members: int, seeds: int
) -> None:
    schedule = generate(seed, 300, members=members, seeds=seeds)
    single = [f for f in schedule if not f.scenario]
    assert single, "a 300 s run has faults"
    minority = (seeds - 1) // 2
    for f in schedule:
        assert f.at > 0 and f.end <= 300
        assert f.fault != "leave" or index(f.target) >= seeds
    for f in single:
        # check at every fault start (the only moments the active set grows)
        assert active_seed_faults(schedule, seeds, f.at) <= minority
        active = [g for g in single if g.at <= f.at < g.end]
        targets = [g.target for g in active]
        assert len(targets) == len(set(targets)), "two faults on one member at once"
        # "leader" is resolved at run time to a seed not already faulted
        assert sum(g.target == "leader" for g in active) <= 1


@pytest.mark.parametrize("members,seeds", [(5, 3), (7, 5)])
@pytest.mark.parametrize("seed", range(20))
def test_a_scenario_window_is_its_own(seed: int, members: int, seeds: int) -> None:
    """No single fault of a seed (nor of the scenario's non-seed) overlaps a scenario
    window (LEAD s before it, its duration, SETTLE s after), and scenarios never overlap
    each other."""
    schedule = generate(seed, 300, members=members, seeds=seeds)
    big = [f for f in schedule if f.scenario]
    for s in big:
        lo, hi = s.at - LEAD, s.end + SETTLE
        for g in schedule:
            if g is s or not (g.at < hi and lo < max(g.end, g.at + 0.001)):
                continue
            assert not g.scenario or g.at < s.at - LEAD, (s, g)
            assert not touches_seeds(g, seeds), (s, g)
            if s.fault in ("sync-kill", "upstream-stop"):
                assert g.target != f"migratory-{non_seed_of(s)}", (s, g)


@pytest.mark.parametrize("seed", range(20))
def test_a_three_minute_run_has_every_scenario_and_over_a_hundred_faults(seed: int) -> None:
    schedule = generate(seed, 180)
    kinds = Counter(f.fault for f in schedule)
    assert set(SCENARIOS) <= set(kinds), kinds
    assert len(schedule) >= 120, "room for the faults skipped at run time"
    assert all(f.at >= 25 for f in schedule if f.fault == "all-seeds-restart")
    for f in schedule:
        if f.fault == "majority-loss":
            assert f.duration >= 6.0  # longer than the publishers' 5 s status timeout
        if f.fault == "lagging-failover":
            lag, down = lag_and_down(f)
            assert 2.5 <= lag <= 3.5 and lag + down == pytest.approx(f.duration)
        if f.fault in ("sync-kill", "upstream-stop"):
            assert non_seed_of(f) >= 3
    lost = [f for f in schedule if f.fault == "lose-disk"]
    assert lose_disk_plan(lost[0]) is not None, "the first lost disk: with the leader down"
    for k, f in enumerate(lost):
        plan = lose_disk_plan(f)
        assert (plan is None) == (k % 2 == 1), lost
        if plan is None:
            assert f.target in ("migratory-0", "migratory-1", "migratory-2")
        else:
            how, down, lag = plan
            assert how in ("kill", "pause") and f.target == "seeds"
            assert down >= 4.0 and lag + down == pytest.approx(f.duration)


def test_short_runs_have_single_faults_only() -> None:
    for seed in range(20):
        assert not any(f.scenario for f in generate(seed, SCENARIOS_FROM - 1))
        assert any(f.scenario for f in generate(seed, SCENARIOS_FROM + 20))


def test_no_proxy_schedule_has_process_faults_only() -> None:
    schedules = [generate(s, 120, proxies=False) for s in range(20)]
    kinds = {f.fault for s in schedules for f in s}
    assert kinds - set(SCENARIOS) <= {"kill", "pause", "leave"}
    assert {"kill", "pause", "leave"} <= kinds
    assert not any("raft-cut" in f.detail for s in schedules for f in s)


def test_without_non_seeds_no_scenario_needs_one() -> None:
    kinds = {f.fault for s in range(20) for f in generate(s, 180, members=3, seeds=3)}
    assert "sync-kill" not in kinds and "upstream-stop" not in kinds
    assert {"lagging-failover", "majority-loss", "all-seeds-restart", "lose-disk"} <= kinds


def test_scenario_details_parse_back() -> None:
    f = Fault(10.0, "lagging-failover", "leader", 4.5,
              "follower paused 3.0s, then the leader killed for 1.5s")
    assert lag_and_down(f) == (3.0, 1.5)
    assert non_seed_of(Fault(1.0, "upstream-stop", "upstream-of-migratory-4", 3.0)) == 4
    assert non_seed_of(Fault(1.0, "sync-kill", "leader", 2.0, "migratory-3 restarted; x")) == 3
    combined = Fault(1.0, "lose-disk", "seeds", 6.5, "leader pause for 4.5s while a follower "
                     "loses its ClusterDataDir; the other follower killed 2.0s before")
    assert lose_disk_plan(combined) == ("pause", 4.5, 2.0)
    alone = Fault(1.0, "lose-disk", "migratory-1", 1.0, "alone: SIGKILL, ClusterDataDir deleted")
    assert lose_disk_plan(alone) is None


def test_replay_schedule_cli_prints_the_schedule() -> None:
    args = [sys.executable, "-m", "chaos", "replay-schedule", "--seed", "7", "--duration", "60"]
    first = subprocess.run(args, cwd=ROOT, capture_output=True, text=True, timeout=30, check=True)
    second = subprocess.run(args, cwd=ROOT, capture_output=True, text=True, timeout=30, check=True)
    assert first.stdout == second.stdout == to_jsonl(generate(7, 60))
