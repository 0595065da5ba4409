"""The restarts of every member (``--scenario whole-restart`` / ``rolling-restart``):
opt-in only, so that a seed's schedule (and CI's runs) stay what they were; a forced
schedule keeps its single faults out of every window; and the nemesis steps, driven
with stand-in members (no process): every member signalled before any starts again,
the rolling order (highest ordinal first, each ready before the next is stopped), a
roll that halts on a member not ready. No real process: well under a second in all."""

from __future__ import annotations

import itertools
import json
import signal
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import trio
import trio.testing

from chaos.__main__ import main
from chaos.history import History
from chaos.members import Member
from chaos.nemesis import Nemesis
from chaos.scenario_faults import run_scenario_fault
from chaos.schedule import (
    LEAD,
    RESTARTS,
    SCENARIOS,
    SETTLE,
    Fault,
    generate,
    rolling_order,
    to_jsonl,
    whole_restart_plan,
)


@pytest.mark.parametrize("members,seeds", [(5, 3), (7, 5), (3, 3)])
def test_the_seeded_rotation_never_restarts_every_member(members: int, seeds: int) -> None:
    kinds = {f.fault for s in range(6) for f in generate(s, 180, members=members, seeds=seeds)}
    assert not kinds & set(RESTARTS) and set(SCENARIOS) & kinds


@pytest.mark.parametrize("forced", [("whole-restart",), ("rolling-restart",),
                                    ("whole-restart", "rolling-restart", "sync-kill")])
@pytest.mark.parametrize("seed", range(4))
def test_a_forced_schedule_has_those_scenarios_only_each_in_a_window_of_its_own(
    seed: int, forced: tuple[str, ...]
) -> None:
    schedule = generate(seed, 120, forced=forced)
    big = [f for f in schedule if f.scenario]
    assert big and {f.fault for f in big} <= set(forced)
    for a, b in itertools.pairwise(big):
        assert b.at >= a.end + SETTLE + LEAD, (a, b)
    for s in (f for f in big if f.target == "all"):
        # no single fault of any member from LEAD s before the window to SETTLE s after
        near = [g for g in schedule if not g.scenario and g.at < s.end + SETTLE
                and s.at - LEAD < g.end]
        assert near == [], (s, near[:3])
    assert generate(seed, 120, forced=forced) == schedule


def test_forced_scenarios_come_in_runs_under_thirty_seconds_too() -> None:
    assert not any(f.scenario for f in generate(3, 29))
    assert [f.fault for f in generate(3, 29, forced=("whole-restart",)) if f.scenario] == [
        "whole-restart"
    ]


def test_the_plans_in_the_details() -> None:
    whole = [f for s in range(10) for f in generate(s, 60, forced=("whole-restart",))
             if f.scenario]
    plans = {whole_restart_plan(f) for f in whole}
    assert {how for how, _ in plans} == {"kill", "term"}
    assert all(1.0 <= down <= 3.0 for _, down in plans)
    (roll,) = [f for f in generate(1, 120, members=6, seeds=5, forced=("rolling-restart",))
               if f.scenario]
    assert rolling_order(roll) == [5, 4, 3, 2, 1, 0]


def test_cli_replay_schedule_takes_scenario(capsys: pytest.CaptureFixture[str]) -> None:
    args = ["replay-schedule", "--seed", "4", "--duration", "60"]
    assert main([*args, "--scenario", "rolling-restart,whole-restart"]) == 0
    forced = ("rolling-restart", "whole-restart")
    assert capsys.readouterr().out == to_jsonl(generate(4, 60, forced=forced))
    assert main(args) == 0
    assert capsys.readouterr().out == to_jsonl(generate(4, 60))


@pytest.mark.parametrize("text", ["reboot", "whole-restart,whole-restart", ""])
def test_cli_refuses_unknown_or_repeated_scenarios(
    text: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit):
        main(["replay-schedule", "--seed", "1", "--duration", "60", "--scenario", text])
    assert "--scenario takes distinct names among" in capsys.readouterr().err


def test_cli_refuses_scenario_with_a_written_schedule(tmp_path: Path) -> None:
    (tmp_path / "s.jsonl").write_text("")
    args = ["run", "--seed", "1", "--duration", "5", "--out", str(tmp_path / "r"),
            "--schedule", str(tmp_path / "s.jsonl"), "--scenario", "whole-restart"]
    with pytest.raises(SystemExit, match="one or the other"):
        main(args)


# --- the nemesis steps, with stand-in members ----------------------------------------

ROLL_OF_FOUR = next(f for f in generate(1, 90, members=4, forced=("rolling-restart",))
                    if f.scenario)


class StandIn(Member):
    """A member with no process: what the nemesis does to it goes to ``events``."""

    def __init__(self, index: int, events: list[tuple[str, str]], out: Path) -> None:
        super().__init__(index, {}, 0, 0, out / "x.log", {}, lambda m, status: None)
        self.events, self.state = events, "up"
        self.process = SimpleNamespace(pid=1000 + index, returncode=0)  # type: ignore[assignment]

    def start(self) -> None:
        self.events.append(("start", self.name))
        self.state = "up"

    def signal(self, sig: int) -> None:
        self.events.append((signal.Signals(sig).name, self.name))

    def wait_exit(self, timeout: float) -> bool:
        return True


def nemesis(
    tmp_path: Path, members: int, not_ready: frozenset[int] = frozenset()
) -> tuple[Nemesis, list[tuple[str, str]]]:
    """A nemesis over stand-ins; member 1 leads Raft; ``not_ready`` never become ready."""
    events: list[tuple[str, str]] = []

    async def wait_ready(indexes: list[int], timeout: float) -> bool:
        await trio.sleep(1.0)  # a member takes a while to be ready
        events.extend(("ready", f"migratory-{i}") for i in indexes if i not in not_ready)
        return not set(indexes) & not_ready

    nem = Nemesis(
        schedule=[], members=[StandIn(i, events, tmp_path) for i in range(members)],
        proxy_of={}, seeds=3, status={1: {"raft_state": "leader"}},
        history=History(tmp_path, "t", 0.0), say=lambda text: None, wait_ready=wait_ready,
        scenarios=run_scenario_fault,
    )
    return nem, events


def run_fault(nem: Nemesis, f: Fault) -> list[dict[str, Any]]:
    """Apply ``f`` (in mock time); the nemesis rows written."""
    trio.run(nem.apply, f, 0.0, clock=trio.testing.MockClock(autojump_threshold=0))
    nem.h.flush()
    path = nem.h.files["nemesis"].name
    return [json.loads(line) for line in Path(path).read_text().splitlines()]


@pytest.mark.parametrize("how,sig", [("kill", "SIGKILL"), ("term", "SIGTERM")])
def test_whole_restart_signals_every_member_before_any_starts(
    tmp_path: Path, how: str, sig: str
) -> None:
    nem, events = nemesis(tmp_path, 5)
    rows = run_fault(nem, Fault(1.0, "whole-restart", "all", 14.5, f"{how} every member, all "
                                "down for 2.5s"))
    names = [f"migratory-{i}" for i in range(5)]
    assert sorted(events[:5]) == [(sig, n) for n in names]
    assert sorted(events[5:10]) == [("start", n) for n in names]
    assert sorted(events[10:]) == [("ready", n) for n in names]
    ((lost, back, what),) = nem.majority_lost
    assert lost <= back and "whole-restart" in what  # (history time: the wall clock)
    assert nem.faulted == {} and nem.applied == {"whole-restart": 1}
    down = "kill" if how == "kill" else "stop"
    starts = [(r["fault"], r["target"]) for r in rows if r["phase"] == "start"]
    assert starts == sorted(starts, key=lambda s: s[0] != down)  # every one down, then up
    leader = next(r for r in rows if r["target"] == "migratory-1")
    assert leader["detail"].startswith("leader, whole-restart: ")
    if how == "term":
        ends = [r["detail"] for r in rows if r["fault"] == "stop" and r["phase"] == "end"]
        assert len(ends) == 5 and all(d.startswith("exited 0 after ") for d in ends)


def test_rolling_restart_goes_highest_ordinal_first_each_ready_before_the_next(
    tmp_path: Path,
) -> None:
    nem, events = nemesis(tmp_path, 4)
    run_fault(nem, ROLL_OF_FOUR)
    expected = []
    for i in (3, 2, 1, 0):
        expected += [("SIGTERM", f"migratory-{i}"), ("start", f"migratory-{i}"),
                     ("ready", f"migratory-{i}")]
    assert events == expected
    assert nem.majority_lost == [] and nem.faulted == {}


def test_rolling_restart_halts_at_a_member_not_ready(tmp_path: Path) -> None:
    nem, events = nemesis(tmp_path, 4, not_ready=frozenset({2}))
    rows = run_fault(nem, ROLL_OF_FOUR)
    assert [e for e in events if e[0] == "SIGTERM"] == [("SIGTERM", "migratory-3"),
                                                        ("SIGTERM", "migratory-2")]
    assert events[-1] == ("start", "migratory-2")
    assert [r["detail"] for r in rows if r["fault"] == "restart" and r["phase"] == "end"] == [
        "ready", "NOT ready after 30 s"]
    assert nem.faulted == {}


class SilentProxy:
    """A seed's client proxy through which the restarted non-seed never gets a byte."""

    def refuse(self, pid: int | None) -> None:
        pass

    def follow(self, pid: int | None, threshold: int = 0) -> Any:
        if pid is None:
            return None
        return SimpleNamespace(reached=trio.Event(), bytes=0, first=None)


def test_a_sync_kill_whose_catch_up_never_started_is_tried_again(tmp_path: Path) -> None:
    """The restarted non-seed got nothing from the leader within SYNC_WATCH (its restart
    slower than that: CI on a busy box, '0 KiB sent'). Before: the leader was killed at
    once, on the first attempt, the catch-up the scenario names never happened. Now it
    is tried again, and the last attempt says what was sent."""
    from chaos.scenarios import SYNC_ATTEMPTS

    nem, _ = nemesis(tmp_path, 5)
    nem.proxy_of = {i: [SilentProxy()] for i in range(3)}  # type: ignore[dict-item]
    rows = run_fault(nem, Fault(1.0, "sync-kill", "leader", 1.5,
                                "migratory-4 restarted; the leader killed for 1.5s"))
    kills = [r for r in rows if r["fault"] == "kill" and r["phase"] == "start"]
    restarts = [r for r in kills if "so that it needs a cache sync" in r["detail"]]
    assert [r["target"] for r in restarts] == ["migratory-4"] * SYNC_ATTEMPTS
    (leader_kill,) = [r for r in kills if "while it sends migratory-4" in r["detail"]]
    assert leader_kill["target"] == "migratory-1" and "(0 KiB sent)" in leader_kill["detail"]
