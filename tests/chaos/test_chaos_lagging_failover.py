"""The lagging-failover scenario's wait (chaos/scenarios.py ``lagging_failover``): the
follower stays stopped until the other seeds are ahead of it, as their ``/cluster``
samples show, at most ``BEHIND_WAIT`` s. Before, it was stopped a fixed 2.5-3.5 s: on a
busy box the load might commit nothing in that time, and the follower resumed level with
the others -- a failover with no one behind, not what the scenario says. Stand-in
members, a stand-in sampler, mock time: well under a second."""

from __future__ import annotations

import signal
from pathlib import Path
from typing import Any

import pytest
import trio
import trio.testing
from test_chaos_restarts import StandIn

from chaos.history import History
from chaos.nemesis import Nemesis
from chaos.scenario_faults import run_scenario_fault
from chaos.scenarios import AHEAD_BY, BEHIND_WAIT
from chaos.schedule import Fault


@pytest.fixture(autouse=True)
def sampled_only(monkeypatch: pytest.MonkeyPatch) -> None:
    """No member to ask (a thread's real time would let the mock clock run on): the
    follower's applied clsn comes from its last sample."""
    async def unanswered(m: object) -> dict[str, Any]:
        return {}

    monkeypatch.setattr("chaos.scenarios.cluster_status", unanswered)


LAGGING = Fault(0.0, "lagging-failover", "leader", 4.5,
                "follower paused 3.0s, then the leader killed for 1.5s")
AT_PAUSE = 10  # every seed's applied clsn when the follower is stopped
FOLLOWER, LEADER, OTHER = 0, 1, 2


class Seen(StandIn):
    """A stand-in whose signals are noted with the time and the seeds' applied clsns."""

    def __init__(self, index: int, status: dict[int, dict[str, Any]], out: Path) -> None:
        super().__init__(index, [], out)
        self.status = status
        self.seen: list[tuple[str, float, dict[int, Any]]] = []

    def signal(self, sig: int) -> None:
        applied = {i: st.get("applied_clsn") for i, st in self.status.items()}
        self.seen.append((signal.Signals(sig).name, trio.current_time(), applied))


def failover(tmp_path: Path, commit_every: float | None) -> tuple[Seen, Seen, list[str]]:
    """The scenario over 5 stand-ins (3 seeds, seed 1 leading); a sampler that shows the
    leader and the other follower applying one commit every ``commit_every`` s from 3 s
    on (None: never); (the follower, the leader, what the run's log said)."""
    status: dict[int, dict[str, Any]] = {
        i: {"applied_clsn": AT_PAUSE} for i in range(5)}
    status[LEADER]["raft_state"] = "leader"
    said: list[str] = []
    members = [Seen(i, status, tmp_path) for i in range(5)]

    async def wait_ready(indexes: list[int], timeout: float) -> bool:
        return True

    nem = Nemesis(
        schedule=[], members=members, proxy_of={}, seeds=3, status=status,
        history=History(tmp_path, "t", 0.0), say=said.append, wait_ready=wait_ready,
        scenarios=run_scenario_fault,
    )

    async def committing() -> None:
        if commit_every is None:
            return
        await trio.sleep(3.0)
        while True:
            for i in (LEADER, OTHER):
                status[i]["applied_clsn"] += 1
            await trio.sleep(commit_every)

    async def main() -> None:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(committing)
            await nem.apply(LAGGING, 0.0)
            nursery.cancel_scope.cancel()

    trio.run(main, clock=trio.testing.MockClock(autojump_threshold=0))
    return members[FOLLOWER], members[LEADER], said


def test_the_follower_resumes_once_the_others_are_ahead_of_it(tmp_path: Path) -> None:
    """A slow load: a commit every 2 s from 3 s. Before: resumed at 3.0 s, the others at
    the follower's clsn 10 and 11 ('assert 11 >= (10 + 2)')."""
    follower, leader, said = failover(tmp_path, 2.0)
    (stop, at_stop, _), (cont, resumed, applied) = follower.seen
    assert (stop, cont) == ("SIGSTOP", "SIGCONT")
    assert applied[LEADER] >= AT_PAUSE + AHEAD_BY and applied[OTHER] >= AT_PAUSE + AHEAD_BY
    assert 5.0 <= resumed - at_stop < 6.0  # the second commit came at 5 s
    (kill, killed, _) = leader.seen[0]
    assert kill == "SIGKILL" and killed == resumed  # the leader dies as the follower resumes
    assert not [s for s in said if "not behind" in s]


def test_a_follower_the_others_never_pass_resumes_at_the_bound_said(tmp_path: Path) -> None:
    follower, leader, said = failover(tmp_path, None)
    (_, at_stop, _), (_, resumed, _) = follower.seen
    assert resumed - at_stop == BEHIND_WAIT
    assert leader.seen[0][0] == "SIGKILL"
    assert [s for s in said if "not behind" in s] == [
        "lagging-failover: migratory-0 not behind within 20s (it had applied 10; the "
        "others {'migratory-1': 10, 'migratory-2': 10}): the leader killed anyway"]


def test_a_brisk_load_resumes_the_follower_at_its_scheduled_time(tmp_path: Path) -> None:
    follower, _, _ = failover(tmp_path, 0.1)
    (_, at_stop, _), (_, resumed, _) = follower.seen
    assert resumed - at_stop < 3.5  # its 3.0 s, and the next sample's 0.1 s at most
