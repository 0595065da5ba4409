"""What happens to an applied entry when a Raft leader re-sends an overlapping range.

pysyncobj 0.3.17 logs "truncating already-applied log entries ... state machine may have
diverged" when a follower receives an AppendEntries whose prevLogIdx is before entries
it has already applied. With ``appendEntriesUseBatch=False`` (as our seeds run it) the
leader re-sends overlapping ranges all the time: each follower reply rewinds the
leader's ``nextIndex`` to just after the entries that reply acknowledged, so the next
send starts again from there. These schedules, on real pysyncobj nodes
(:mod:`raft_sim`), show step by step what pysyncobj's follower does then, what
:class:`~cluster.raft_follower.FollowerSafeSyncObj` does instead, and that the checker
catches the planted bugs.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from pysyncobj import SyncObj
from raft_planted import TruncatesAfterPrevious, VotesForAnyLog
from raft_sim import RaftWorld

from cluster.raft_follower import FollowerSafeSyncObj

BATCH_BYTES = 60  # two of these small entries per AppendEntries: a re-send comes in parts


def started(node_class: type[Any]) -> tuple[RaftWorld, str, str, str]:
    """A world whose first leader is elected; (world, leader, follower, other follower)."""
    world = RaftWorld(3, node_class=node_class, batch_bytes=BATCH_BYTES, seed=1)
    for _ in range(20):
        world.step(0.05)
    leader = world.leader()
    assert leader is not None
    follower, other = [a for a in world.addresses if a != leader]
    return world, leader, follower, other


@pytest.fixture
def worlds() -> Iterator[list[RaftWorld]]:
    made: list[RaftWorld] = []
    yield made
    for world in made:
        world.close()


def log_of(world: RaftWorld, address: str) -> list[tuple[int, int]]:
    return [(index, term) for _, index, term in world.nodes[address]._SyncObj__raftLog[:]]


def applied_then_resent(node_class: type[Any], worlds: list[RaftWorld]) -> dict[str, Any]:
    """The follower applies four entries, then the leader's re-send from the first one
    starts to arrive (its first part only)."""
    world, leader, follower, other = started(node_class)
    worlds.append(world)
    for i in range(4):
        world.submit(leader, b"e%d" % i)
    world.tick(leader)  # appended, one AppendEntries per entry to each follower
    world.deliver(leader, other, 99)
    world.deliver(other, leader, 99)
    world.tick(leader)  # committed (leader + other) and the commit index sent
    world.deliver(leader, follower, 99)
    world.tick(follower)  # the follower holds and applies all four
    node = world.nodes[follower]
    before = {"log": log_of(world, follower), "applied": node.raftLastApplied}
    world.deliver(follower, leader, 1)  # its first reply: the leader rewinds nextIndex
    world.clock.now += 0.05
    world.tick(leader)  # the heartbeat re-sends from there, in parts
    world.deliver(leader, follower, 1)
    return {
        "world": world,
        "follower": follower,
        "before": before,
        "log": log_of(world, follower),
        "applied": node.raftLastApplied,
        "commit": node.raftCommitIndex,
        "critical": world.critical_lines(),
    }


def test_pysyncobj_drops_applied_entries_from_its_log_on_an_overlapping_resend(
    worlds: list[RaftWorld],
) -> None:
    seen = applied_then_resent(SyncObj, worlds)
    last = seen["before"]["log"][-1][0]
    assert seen["before"]["applied"] == last  # every entry was applied
    assert ["truncating already-applied log entries" in line for line in seen["critical"]] == [
        True
    ]
    # the applied entry is gone from the log, and the commit index went back below it
    assert seen["log"] == seen["before"]["log"][:-1]
    assert seen["commit"] < seen["applied"] == last
    # the same command comes back with the rest of the re-send, and nothing is re-applied:
    # the state machine did not change; what changed is that the follower no longer held
    # an entry it had acknowledged
    world = seen["world"]
    world.step(0.05)
    assert log_of(world, seen["follower"]) == seen["before"]["log"]
    assert world.violations()[0].endswith(f"but its commit index fell to {seen['commit']}")


def test_the_follower_keeps_applied_entries_on_an_overlapping_resend(
    worlds: list[RaftWorld],
) -> None:
    seen = applied_then_resent(FollowerSafeSyncObj, worlds)
    assert seen["log"] == seen["before"]["log"]
    assert seen["commit"] == seen["applied"] == seen["before"]["applied"]
    assert seen["critical"] == []
    seen["world"].step(0.05)
    assert seen["world"].violations() == []


def leader_dies_mid_resend(node_class: type[Any], worlds: list[RaftWorld]) -> RaftWorld:
    """The other follower is cut off; the leader commits four commands with the
    follower's acknowledgements while re-sending them, and dies between two parts of
    the re-send; then the followers elect a new leader, and everything heals."""
    world, leader, follower, other = started(node_class)
    worlds.append(world)
    world.cut(leader, other)
    for i in range(4):
        world.submit(leader, b"e%d" % i)
    world.tick(leader)
    world.deliver(leader, follower, 99)  # the follower holds e0..e3, four replies on the way
    world.deliver(follower, leader, 1)  # the first: the leader rewinds nextIndex
    world.clock.now += 0.05
    world.tick(leader)  # re-sends from there, in two parts
    world.deliver(leader, follower, 1)  # the first part
    world.deliver(follower, leader, 99)
    world.tick(leader)  # all four acknowledged (leader + follower: a majority)
    assert sorted(world.acknowledged) == [b"e0", b"e1", b"e2", b"e3"]
    world.crash(leader)  # the second part is lost with it
    for _ in range(40):
        world.step(0.05)
    world.heal_all()
    for _ in range(40):
        world.step(0.05)
    return world


@pytest.mark.parametrize("planted", [SyncObj, TruncatesAfterPrevious])
def test_dropping_held_entries_loses_an_acknowledged_command(
    planted: type[Any], worlds: list[RaftWorld]
) -> None:
    world = leader_dies_mid_resend(planted, worlds)
    assert any("committed by term 1" in problem for problem in world.violations())
    assert not world.converged()  # e3 was acknowledged, and no node applies it


def test_the_follower_keeps_an_acknowledged_command_when_the_leader_dies_mid_resend(
    worlds: list[RaftWorld],
) -> None:
    world = leader_dies_mid_resend(FollowerSafeSyncObj, worlds)
    assert world.violations() == []
    assert world.converged()


def lagging_candidate(node_class: type[Any], worlds: list[RaftWorld]) -> RaftWorld:
    """Commands committed while one follower was cut off; the leader dies; the follower
    that lacks them asks for votes first."""
    world, leader, follower, other = started(node_class)
    worlds.append(world)
    world.cut(leader, other)
    world.cut(follower, other)
    for i in range(3):
        world.submit(leader, b"c%d" % i)
    for _ in range(5):
        world.step(0.05)
    assert len(world.acknowledged) == 3
    world.crash(leader)
    world.heal(follower, other)
    # it stands without asking for pre-votes first (as a seed of the version before
    # cluster/raft_prevote.py would): what is tested is the real vote
    world.nodes[other].pre_vote_enabled = False
    world.clock.now += 0.05
    world.tick(other)  # its election timeout passed long ago: it is a candidate first
    world.deliver(other, follower, 99)
    world.tick(follower)
    world.deliver(follower, other, 99)
    world.tick(other)
    for _ in range(20):
        world.step(0.05)
    return world


def test_a_candidate_without_a_committed_entry_gets_no_vote(worlds: list[RaftWorld]) -> None:
    world = lagging_candidate(FollowerSafeSyncObj, worlds)
    assert world.violations() == []
    assert world.converged()


def test_the_checker_catches_a_vote_for_a_log_without_a_committed_entry(
    worlds: list[RaftWorld],
) -> None:
    world = lagging_candidate(VotesForAnyLog, worlds)
    assert any("committed by term" in problem for problem in world.violations())
