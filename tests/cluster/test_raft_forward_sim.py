"""A follower that cannot reach the leader holds the command it was given
(cluster/raft_forward.py), on the simulated network and clock of :mod:`raft_sim`: real
pysyncobj nodes with our follower, every step chosen by the test.

pysyncobj 0.3.17's follower forwards a command with a send whose ``False`` it ignores: the
command is gone, and its callback is called only at the next leader change. With the
leader still leading, never: each ``plain`` case below shows that, the ``holding`` one
what the hold does instead.
"""

from __future__ import annotations

import pickle
import random
import re
from typing import Any

import pytest
from pysyncobj import FAIL_REASON
from raft_sim import RaftWorld, simulated

from cluster.raft_follower import FollowerSafeSyncObj
from cluster.raft_forward import NOT_SENT, ForwardHold, Held, HoldsForwards, SendBy

RUNS = 150
STEP = 0.01  # well inside the election timeout (0.15-0.30 s): no follower stands


class HoldingNode(HoldsForwards, FollowerSafeSyncObj):
    pass


def elect(world: RaftWorld) -> tuple[str, list[str]]:
    for _ in range(60):
        world.step(0.05)
    leader = world.leader()
    assert leader is not None
    for _ in range(10):  # every follower has heard the leader
        world.step(STEP)
    return leader, [a for a in world.addresses if a != leader]


def submit(world: RaftWorld, address: str, value: bytes, send_by: float | None = None) -> list[Any]:
    outcomes: list[Any] = []

    def done(result: Any, error: int) -> None:
        outcomes.append((result, error))

    world.recorders[address].put(value, callback=done if send_by is None else SendBy(done, send_by))
    return outcomes


def commits_of(world: RaftWorld, value: bytes) -> int:
    """Log indexes ``value`` was applied at (on any node)."""
    return sum(1 for v in world.applied.values() if v == value)


def term_of(world: RaftWorld, address: str) -> int:
    term: int = world.nodes[address].raftCurrentTerm
    return term


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_a_command_given_while_the_link_to_the_leader_is_down_commits_once_it_is_back(
    seed: int,
) -> None:
    with simulated(3, node_class=HoldingNode, seed=seed) as world:
        leader, (follower, _) = elect(world)
        term = term_of(world, leader)
        world.cut(leader, follower)
        outcomes = submit(world, follower, b"held")
        world.tick(follower)  # forwards it: the link is down
        assert len(world.nodes[follower].forward_hold) == 1
        world.heal(leader, follower)
        for _ in range(20):
            world.step(STEP)
        assert outcomes and outcomes[0][1] == FAIL_REASON.SUCCESS, outcomes
        assert len(outcomes) == 1 and commits_of(world, b"held") == 1
        assert (world.leader(), term_of(world, leader)) == (leader, term)  # no leader change
        assert world.violations() == [] and world.converged()


def test_plain_pysyncobj_drops_that_command_and_never_answers_while_the_leader_leads() -> None:
    with simulated(3, seed=0) as world:
        leader, (follower, _) = elect(world)
        world.cut(leader, follower)
        dropped = submit(world, follower, b"dropped")
        world.tick(follower)
        world.heal(leader, follower)
        later = submit(world, follower, b"later")  # the link is up again: this one goes
        for _ in range(20):
            world.step(STEP)
        assert later and later[0][1] == FAIL_REASON.SUCCESS
        assert dropped == [] and commits_of(world, b"dropped") == 0, "pysyncobj changed: revisit"


def test_a_link_whose_handshake_is_not_done_holds_the_command() -> None:
    """A TCP link is up before pysyncobj's handshake on it is done (the node is not
    "connected" yet); a command written then was lost (test_raft_forward_nodes.py)."""
    with simulated(3, node_class=HoldingNode, seed=0) as world:
        leader, (follower, _) = elect(world)
        node = world.nodes[follower]
        peer = node._SyncObj__transport.peers[leader]
        node._SyncObj__connectedNodes.discard(peer)  # the handshake is under way
        outcomes = submit(world, follower, b"early")
        world.tick(follower)
        sent = [pickle.loads(m).get("type") for m in world.queues[(follower, leader)]]
        assert "apply_command" not in sent and len(node.forward_hold) == 1
        node._SyncObj__connectedNodes.add(peer)  # done
        for _ in range(20):
            world.step(STEP)
        assert [o[1] for o in outcomes] == [FAIL_REASON.SUCCESS]
        assert commits_of(world, b"early") == 1


def test_commands_held_together_commit_in_the_order_they_were_given() -> None:
    with simulated(3, node_class=HoldingNode, seed=0) as world:
        leader, (follower, _) = elect(world)
        world.cut(leader, follower)
        first = submit(world, follower, b"first")
        world.tick(follower)
        second = submit(world, follower, b"second")
        world.tick(follower)
        world.heal(leader, follower)
        third = submit(world, follower, b"third")  # given after the link came back
        for _ in range(20):
            world.step(STEP)
        assert [o[0][1] for o in (first, second, third)] == [FAIL_REASON.SUCCESS] * 3
        indexes = [o[0][0] for o in (first, second, third)]
        assert indexes == sorted(indexes), "held commands overtaken"


def test_a_held_command_past_its_deadline_fails_and_is_never_sent() -> None:
    with simulated(3, node_class=HoldingNode, seed=0) as world:
        leader, (follower, _) = elect(world)
        world.cut(leader, follower)
        outcomes = submit(world, follower, b"too-late", send_by=world.clock.now + 0.03)
        world.tick(follower)
        for _ in range(5):  # the deadline passes with the link down (no election yet)
            world.step(STEP)
        assert outcomes == [(None, NOT_SENT)]
        world.heal(leader, follower)
        later = submit(world, follower, b"later")
        for _ in range(20):
            world.step(STEP)
        assert later and later[0][1] == FAIL_REASON.SUCCESS
        assert outcomes == [(None, NOT_SENT)] and commits_of(world, b"too-late") == 0


def test_a_command_held_when_the_leader_dies_commits_under_the_next_leader() -> None:
    """pysyncobj would fail it LEADER_CHANGED (outcome unknown: a barrier, then
    PUBLISH_FAILED); it was never sent, so it is forwarded to the new leader instead."""
    for node_class, expect in ((HoldingNode, FAIL_REASON.SUCCESS),
                               (FollowerSafeSyncObj, FAIL_REASON.LEADER_CHANGED)):
        with simulated(3, node_class=node_class, seed=0) as world:
            leader, (follower, _) = elect(world)
            world.crash(leader)
            outcomes = submit(world, follower, b"held")
            world.tick(follower)
            for _ in range(100):
                world.step(STEP)
            assert world.leader() not in (None, leader)
            assert [o[1] for o in outcomes] == [expect], node_class
            assert commits_of(world, b"held") == (expect == FAIL_REASON.SUCCESS)
            assert world.violations() == []


class CountingNode(HoldingNode):
    """Keeps every hold it made, to count what the search did with them."""

    holds: list[ForwardHold] = []

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        CountingNode.holds.append(self.forward_hold)


class SendsTwice(ForwardHold):
    """Planted: a released command is handed back to pysyncobj twice."""

    def release(self, now: float) -> list[Held]:
        return [held for held in super().release(now) for _ in range(2)]


class PlantedNode(CountingNode):
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.forward_hold = SendsTwice()
        CountingNode.holds.append(self.forward_hold)


def search(node_class: type[Any], compaction: bool) -> str | None:
    """test_raft_safety.py's seeded schedules (cuts, resets, crashes, commands at any
    node): the first problem -- a safety property broken, or a command committed twice
    (a held command sent once too often would be) -- or None."""
    from test_raft_safety import EVERY_ACTION, LARGE, Schedule, seeded_actions

    for seed in range(RUNS):
        rng = random.Random(seed)
        schedule = Schedule(node_class, rng.choice(LARGE[0]), seed, compaction)
        pick = seeded_actions(rng, LARGE[1], EVERY_ACTION)
        try:
            for _ in range(60):
                pick(schedule)
                if schedule.world.violations():
                    break
            problems = schedule.world.violations() or schedule.finish()
            if problems:
                return f"seed {seed}: {problems}"
            values = list(schedule.world.applied.values())
            if len(values) != len(set(values)):
                return f"seed {seed}: a command committed twice"
        finally:
            schedule.world.close()
    return None


@pytest.mark.parametrize("compaction", [False, True], ids=["log", "compaction"])
def test_the_seeded_search_finds_nothing_wrong_with_held_forwards(compaction: bool) -> None:
    CountingNode.holds = []
    assert search(CountingNode, compaction) is None
    held = sum(h.stats.held for h in CountingNode.holds)
    released = sum(h.stats.released for h in CountingNode.holds)
    assert held >= 100 and released >= 20, (held, released)  # the hold was exercised


def test_the_seeded_search_finds_a_hold_that_sends_a_command_twice() -> None:
    """Committed twice: seen at the end, or, as soon as both copies are applied, as a
    command acknowledged at one index and applied at another."""
    problem = search(PlantedNode, compaction=False)
    assert problem is not None, problem
    assert "committed twice" in problem or re.search(
        r"acknowledged at (\d+), \S+ applied it at (?!\1\b)\d+", problem), problem
