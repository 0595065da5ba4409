"""A submitter's callback is answered when its entry leaves the log unapplied.

pysyncobj 0.3.17 keeps a submitted command's callback by log index until the entry at
that index is applied (then SUCCESS, or DISCARDED if another term's entry is there). An
entry that a new leader's log replaces (the follower truncates it) or that a loaded dump
covers is never applied here: its callback waited until the log grew back to its index,
and for ever when nothing more was submitted. The three-seed dump benchmark stalled that
way in its commit phase (a leader change with its 660 commands appended: the callbacks of
the tail the new leader replaced never came; benchmarks/raft_leader_dump_election.py).
Now such a callback gets UNKNOWN_OUTCOME at once (not DISCARDED: a replaced entry may
still commit through another node, Raft's figure 8; the seed's barrier settles it).
"""

from __future__ import annotations

import pickle
from typing import Any

from pysyncobj import FAIL_REASON
from raft_sim import simulated

A, B, C = "127.0.0.1:1", "127.0.0.1:2", "127.0.0.1:3"


def elect(world: Any) -> str:
    for _ in range(200):
        world.step(0.05)
        leader = world.leader()
        if leader is not None:
            return str(leader)
    raise AssertionError("no leader")


def test_a_replaced_tail_answers_its_callbacks() -> None:
    outcomes: list[Any] = []
    with simulated(3) as world:
        first = elect(world)
        others = [a for a in world.addresses if a != first]
        for other in others:
            world.cut(first, other)
        for i in range(3):  # appended by the cut-off leader only: they cannot commit
            world.recorders[first].put(
                b"lost-%d" % i, callback=lambda result, error: outcomes.append(error))
        for _ in range(4):
            world.step(0.01)  # (the leader appends its queued commands in a tick)
        assert world.nodes[first]._SyncObj__getCurrentLogIndex() >= 3
        for _ in range(400):  # the two others elect a leader of a higher term
            world.step(0.05)
            if world.nodes[others[0]]._SyncObj__raftState == 2 or (
                    world.nodes[others[1]]._SyncObj__raftState == 2):
                break
        for other in others:
            world.heal(first, other)
        for _ in range(100):  # the old leader follows; its tail is replaced
            world.step(0.05)
        assert world.converged()
        # each answered (before: the one index the new leader refilled, DISCARDED; two never)
        assert outcomes == [FAIL_REASON.UNKNOWN_OUTCOME] * 3, outcomes


def test_entries_a_loaded_dump_covers_answer_their_callbacks() -> None:
    outcomes: list[Any] = []
    with simulated(3, compaction_entries=8, send_seconds=0.0005) as world:
        first = elect(world)
        others = [a for a in world.addresses if a != first]
        for other in others:
            world.cut(first, other)
        for i in range(3):
            world.recorders[first].put(
                b"lost-%d" % i, callback=lambda result, error: outcomes.append(error))
        for _ in range(4):
            world.step(0.01)
        new = None
        for _ in range(400):
            world.step(0.05)
            new = world.leader() if world.leader() != first else None
            if new is not None and world.nodes[new].raftCurrentTerm > world.nodes[
                    first].raftCurrentTerm:
                break
        assert new is not None
        for i in range(40):  # the new leader's log moves past the old one's, compacted
            world.submit(new, b"new-%d" % i)
            world.step(0.01)
        assert world.nodes[new]._SyncObj__raftLog[0][1] > 4
        installed = world.dumps_installed
        for other in others:
            world.heal(first, other)
        for _ in range(100):
            world.step(0.05)
        assert world.converged()
        assert world.dumps_installed > installed  # the old leader took the new one's dump
        # before: none answered (the dump covers their indices: never applied there)
        assert outcomes == [FAIL_REASON.UNKNOWN_OUTCOME] * 3, outcomes


def test_a_forwarded_command_the_old_leader_never_sent_is_answered_at_a_leader_change(
) -> None:
    """A follower forwards two commands; the leader appends them and answers their log
    indices, then is cut off before it sends them: they wait on the follower for indices
    it never receives from that leader. The next leader's log need never reach them."""
    outcomes: list[Any] = []
    with simulated(3) as world:
        leader = elect(world)
        follower, third = [a for a in world.addresses if a != leader]
        world.step(0.01)
        for i in range(2):
            world.recorders[follower].put(
                b"fwd-%d" % i, callback=lambda result, error: outcomes.append(error))
        world.tick(follower)  # forwarded (apply_command)
        world.deliver(follower, leader, 10)
        world.tick(leader)  # appended; its answers first, then its AppendEntries
        queue = world.queues[(leader, follower)]
        answers = [raw for raw in queue
                   if pickle.loads(raw).get("type") == "apply_command_response"]
        assert len(answers) == 2 and all("log_idx" in pickle.loads(m) for m in answers)
        queue.clear()
        queue.extend(answers)  # its AppendEntries lost on the way: the answers only
        world.deliver(leader, follower, 2)
        world.cut(leader, follower)
        world.cut(leader, third)  # what it sent is lost
        for _ in range(400):
            world.step(0.05)
            if world.leader() in (follower, third) and world.nodes[
                    world.leader()].raftCurrentTerm > world.nodes[leader].raftCurrentTerm:
                break
        for _ in range(20):
            world.step(0.05)
        # before: never answered (their indices are not in any log this follower sees)
        assert len(outcomes) == 2 and FAIL_REASON.SUCCESS not in outcomes, outcomes


def test_a_forward_whose_answer_a_broken_link_lost_is_answered() -> None:
    """The leader appended a forwarded command and answered it; the link broke with the
    answer in flight and came back, the leader still leading: pysyncobj's follower waited
    for that answer (``__commandsWaitingReply``) until the next leader change."""
    outcomes: list[Any] = []
    with simulated(3) as world:
        leader = elect(world)
        follower = next(a for a in world.addresses if a != leader)
        world.step(0.01)
        world.recorders[follower].put(b"fwd", callback=lambda result, error: outcomes.append(
            error))
        world.tick(follower)
        world.deliver(follower, leader, 10)
        world.tick(leader)  # appended: its answer and AppendEntries in flight
        world.reset(leader, follower)  # lost with the connection; a new one at once
        for _ in range(40):
            world.step(0.05)
        assert world.leader() == leader and world.converged()
        # before: [] (waiting for an answer no one will send)
        assert outcomes == [FAIL_REASON.UNKNOWN_OUTCOME], outcomes
