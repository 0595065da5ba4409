"""The nemesis schedule: deterministic per seed, never more than a minority of seeds faulted."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from chaos.schedule import active_seed_faults, generate, to_jsonl

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("seed", [0, 1, 2, 42, 1234])
def test_same_seed_same_schedule(seed: int) -> None:
    assert generate(seed, 300) == generate(seed, 300)
    assert to_jsonl(generate(seed, 60)) == to_jsonl(generate(seed, 60))


def test_different_seeds_differ() -> None:
    assert generate(1, 120) != generate(2, 120)


@pytest.mark.parametrize("members,seeds", [(5, 3), (7, 5), (3, 3)])
@pytest.mark.parametrize("seed", range(40))
def test_minority_of_seeds_and_one_fault_per_member(seed: int, members: int, seeds: int) -> None:
    schedule = generate(seed, 300, members=members, seeds=seeds)
    assert schedule, "a 300 s run has faults"
    minority = (seeds - 1) // 2
    for f in schedule:
        assert f.at > 0 and f.end <= 300
        assert f.fault != "leave" or int(f.target.rsplit("-", 1)[1]) >= seeds
        # check at every fault start (the only moments the active set grows)
        assert active_seed_faults(schedule, seeds, f.at) <= minority
        active = [g for g in schedule if g.at <= f.at < g.end]
        targets = [g.target for g in active]
        assert len(targets) == len(set(targets)), "two faults on one member at once"
        # "leader" is resolved at run time to a seed not already faulted
        assert sum(g.target == "leader" for g in active) <= 1


def test_no_proxy_schedule_has_only_process_faults() -> None:
    kinds = {f.fault for s in range(20) for f in generate(s, 120, proxies=False)}
    assert kinds <= {"kill", "pause", "leave"}
    assert {"kill", "pause", "leave"} <= kinds


def test_replay_schedule_cli_prints_the_schedule() -> None:
    args = [sys.executable, "-m", "chaos", "replay-schedule", "--seed", "7", "--duration", "60"]
    first = subprocess.run(args, cwd=ROOT, capture_output=True, text=True, timeout=30, check=True)
    second = subprocess.run(args, cwd=ROOT, capture_output=True, text=True, timeout=30, check=True)
    assert first.stdout == second.stdout == to_jsonl(generate(7, 60))
