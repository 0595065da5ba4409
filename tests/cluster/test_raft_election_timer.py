"""A follower's Raft thread wakes just past its election deadline, not at its next
50 ms tick (cluster/raft_election_timer.py): followers that ticked in step after the
leader died stood in the same millisecond and split the vote."""

from __future__ import annotations

from typing import Any

import pysyncobj.syncobj
import pytest
from pysyncobj import SyncObjConf
from pysyncobj.syncobj import _RAFT_STATE, monotonicTime
from raft_sim import RaftWorld
from test_raft_follower import Unconnected

import cluster.raft_follower
from cluster.raft_election_timer import (
    DECAY_SECONDS,
    MAX_DOUBLINGS,
    PAST_DEADLINE,
    deadline_after_joining,
    poll_timeout,
)
from cluster.raft_follower import FollowerSafeSyncObj
from cluster.raft_prevote import ANSWER
from cluster.raft_timings import RaftTimings


@pytest.mark.parametrize(
    ("wait", "deadline", "leader", "expected"),
    [
        (0.05, 10.02, False, 0.02 + PAST_DEADLINE),  # the deadline comes first
        (0.05, 10.30, False, 0.05),  # the tick comes first
        (0.05, 9.90, False, 0.05),  # past (no connection to stand): no spin
        (0.05, 10.02, True, 0.05),  # a leader has no election deadline
        (0.0, 10.02, False, 0.0),  # a tick that must not wait
    ],
)
def test_poll_timeout(wait: float, deadline: float, leader: bool, expected: float) -> None:
    assert poll_timeout(wait, deadline, 10.0, leader=leader) == pytest.approx(expected)


def test_the_seed_node_polls_until_its_deadline(monkeypatch: pytest.MonkeyPatch) -> None:
    # the Raft clock stands still: the wait is the deadline's distance, however long the
    # box takes between setting it and the tick (5 ms of descheduling failed the old bound)
    monkeypatch.setattr(cluster.raft_follower, "monotonicTime", lambda: 100.0)
    monkeypatch.setattr(pysyncobj.syncobj, "monotonicTime", lambda: 100.0)
    node: Any = FollowerSafeSyncObj(
        "127.0.0.1:47911", ["127.0.0.1:47912", "127.0.0.1:47913"],
        conf=SyncObjConf(autoTick=False), transportClass=Unconnected,
    )
    try:
        node._term_quorum.waiting = False
        waits: list[float] = []
        node._poller.poll = waits.append
        node._SyncObj__raftElectionDeadline = 100.02
        node._onTick(0.05)
        assert node._SyncObj__raftState == _RAFT_STATE.FOLLOWER
        assert waits and waits[-1] == pytest.approx(0.02 + PAST_DEADLINE)
    finally:
        node.destroy()


@pytest.mark.parametrize(
    ("links", "follower", "first", "expected"),
    [
        (1, True, True, 10.2),  # its first link since it started: listen a timeout first
        (2, True, True, 9.5),  # linked already: unchanged
        (1, False, True, 9.5),  # a candidate or leader: unchanged
        (1, True, False, 9.5),  # linked before (a heal, not a restart): unchanged
    ],
)
def test_deadline_after_joining(links: int, follower: bool, first: bool, expected: float) -> None:
    assert deadline_after_joining(
        9.5, 10.0, 0.2, links=links, follower=follower, first=first
    ) == expected


def test_a_started_seed_listens_on_its_first_link_before_it_stands() -> None:
    """A restarted seed stood the millisecond its first link came up, before the live
    leader's AppendEntries reached it, and its higher term deposed the leader."""
    node: Any = FollowerSafeSyncObj(
        "127.0.0.1:47921", ["127.0.0.1:47922", "127.0.0.1:47923"],
        conf=SyncObjConf(autoTick=False, raftMinTimeout=0.15, raftMaxTimeout=0.3,
                         appendEntriesPeriod=0.04),
        transportClass=Unconnected,
    )
    try:
        node._term_quorum.waiting = False
        first, second = sorted(node.otherNodes, key=str)
        node._SyncObj__raftElectionDeadline = monotonicTime() - 5  # long past
        node._SyncObj__onNodeConnected(first)
        assert node._SyncObj__raftElectionDeadline > monotonicTime() + 0.1
        node._onTick(0)
        assert node._SyncObj__raftState == _RAFT_STATE.FOLLOWER  # not standing yet
        node._SyncObj__onNodeDisconnected(first)
        node._SyncObj__raftElectionDeadline = monotonicTime() - 5
        node._SyncObj__onNodeConnected(second)  # linked before: no more waiting
        assert node._SyncObj__raftElectionDeadline < monotonicTime()
    finally:
        node.destroy()


def _elect(world: Any, seconds_per_tick: float, ticks: int) -> int | None:
    """The first tick after which there is a leader (None: none in ``ticks``)."""
    for i in range(ticks):
        world.step(seconds_per_tick)
        if world.leader() is not None:
            return i
    return None


@pytest.mark.parametrize("seed", [0, 1, 2])
@pytest.mark.parametrize("seconds_per_tick", [0.35, 0.5])
def test_seeds_that_run_only_every_few_hundred_ms_still_elect(
    seed: int, seconds_per_tick: float
) -> None:
    """Five seeds, each process ticking only every 350 or 500 ms (simulated: a box far
    busier than its cores, a container throttled by its CPU limit), messages arriving
    in between. With fixed 150-300 ms timeouts every seed stands at every tick and no
    one is ever elected (before: no leader in 200 ticks, term 200); with the back-off
    the candidates spread out and one wins, and a leader stays."""
    world = RaftWorld(5, seed=seed)
    try:
        first = _elect(world, seconds_per_tick, 40)
        assert first is not None, "no leader"
        world.submit(world.leader(), b"x")
        for _ in range(10):
            world.step(seconds_per_tick)
        assert b"x" in world.acknowledged and world.violations() == []
        assert max(node.election_doublings() for node in world.nodes.values()) > 0
    finally:
        world.close()


def test_a_failover_in_a_quiet_cluster_is_as_quick_and_the_back_off_decays() -> None:
    """The first candidacy after a leader dies comes within the usual 150-300 ms; once
    a leader is elected, DECAY_SECONDS x MAX_DOUBLINGS later every seed's timeouts are
    the usual ones again."""
    world = RaftWorld(3, seed=5)
    try:
        assert _elect(world, 0.01, 100) is not None
        for _ in range(int(3 * DECAY_SECONDS / 0.05) + 1):
            world.step(0.05)
        assert all(node.election_doublings() == 0 for node in world.nodes.values())
        leader = world.leader()
        assert leader is not None
        world.crash(leader)
        start = world.clock.now
        stood = None
        for _ in range(100):
            world.step(0.005)
            if any(n._SyncObj__raftState != _RAFT_STATE.FOLLOWER for n in world.nodes.values()):
                stood = world.clock.now - start
                break
        assert stood is not None and stood <= 0.30 + 0.005
        assert _elect(world, 0.01, 100) is not None
        assert max(node.election_doublings() for node in world.nodes.values()) >= 1
        for _ in range(int(MAX_DOUBLINGS * DECAY_SECONDS / 0.05) + 1):
            world.step(0.05)
        assert all(node.election_doublings() == 0 for node in world.nodes.values())
    finally:
        world.close()


def test_a_follower_reads_what_came_while_it_was_busy_before_it_stands() -> None:
    """A tick that comes after the election deadline (the Raft thread was busy: a large
    dump loaded, a long collection, a box far busier than its cores) found the leader's
    AppendEntries waiting unread; pysyncobj checks the deadline first, so the follower
    stood, and its higher term deposed a live leader. Now it reads them first."""
    node: Any = FollowerSafeSyncObj(
        "127.0.0.1:47931", ["127.0.0.1:47932", "127.0.0.1:47933"],
        conf=SyncObjConf(autoTick=False), transportClass=Unconnected,
    )
    try:
        node._term_quorum.waiting = False
        node._empty_start.active = False  # a seed with its disk (cluster/raft_votes.py)
        leader, _ = sorted(node.otherNodes, key=str)
        node._SyncObj__connectedNodes.add(leader)  # linked: it may stand
        node._SyncObj__raftCurrentTerm = 2
        waiting = [{"type": "append_entries", "term": 2, "commit_index": 0,
                    "prevLogIdx": 1, "prevLogTerm": 0, "entries": []}]

        def poll(timeout: float) -> None:  # the socket's bytes, read when it polls
            while waiting:
                node._SyncObj__onMessageReceived(leader, waiting.pop())

        node._poller.poll = poll
        node._SyncObj__raftElectionDeadline = monotonicTime() - 1.0  # a second busy
        node._onTick(0)
        assert node._SyncObj__raftState == _RAFT_STATE.FOLLOWER  # before: CANDIDATE
        assert node._SyncObj__raftLeader == leader and node._SyncObj__raftCurrentTerm == 2
        node._SyncObj__raftElectionDeadline = monotonicTime() - 1.0  # silent for real
        node._onTick(0)  # asks for pre-votes first (cluster/raft_prevote.py)
        assert node.pre_vote_campaign().asked == {leader}
        node._SyncObj__onMessageReceived(leader, {  # (the old leader died since)
            "type": ANSWER, "term": 2, "proposed_term": 3, "round": 1, "granted": True,
        })
        node._onTick(0)
        assert node._SyncObj__raftState == _RAFT_STATE.CANDIDATE
    finally:
        node.destroy()


@pytest.mark.parametrize(
    ("election_ms", "decay"),
    [(150, DECAY_SECONDS), (1000, 2 ** MAX_DOUBLINGS * 2.0)],  # ClusterElectionTimeout
)
def test_the_back_off_decays_no_sooner_than_its_longest_timeout(
    monkeypatch: pytest.MonkeyPatch, election_ms: int, decay: float
) -> None:
    """The doublings multiply the configured timeouts (ClusterElectionTimeout); a
    halving waits at least the longest of them. With a fixed 5 s, a 1 s timeout's
    doubling (2-4 s) had decayed before the seed could stand again."""
    clock = [100.0]
    monkeypatch.setattr(pysyncobj.syncobj, "monotonicTime", lambda: clock[0])
    timings = RaftTimings.for_election_timeout(election_ms)
    node: Any = FollowerSafeSyncObj(
        "127.0.0.1:47941", ["127.0.0.1:47942", "127.0.0.1:47943"],
        conf=SyncObjConf(autoTick=False, raftMinTimeout=timings.election_min,
                         raftMaxTimeout=timings.election_max,
                         appendEntriesPeriod=timings.heartbeat,
                         connectionTimeout=timings.connection_timeout),
        transportClass=Unconnected,
    )
    try:
        assert node.decay_seconds() == pytest.approx(decay)
        node._SyncObj__setState(_RAFT_STATE.CANDIDATE)
        assert node.election_doublings() == 1
        timeout = node._SyncObj__generateRaftTimeout()
        assert 2 * timings.election_min <= timeout <= 2 * timings.election_max
        clock[0] += 5.5  # past the fixed 5 s
        assert node.election_doublings() == (0 if election_ms == 150 else 1)
        clock[0] = 100.0 + decay + 0.01
        assert node.election_doublings() == 0
    finally:
        node.destroy()
