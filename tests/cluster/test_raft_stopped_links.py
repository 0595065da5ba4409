"""A seed's Raft node that stops (its disk: cluster/raft_disk.py) closes its links at once,
with three real seed Raft nodes (:class:`~cluster.raft.RaftCoordination`, pysyncobj
threads, TCP on 127.0.0.1; the harness of test_raft_forward_nodes.py).

A stopped leader used to look alive to its followers until their election timeout (and
its links until ``connectionTimeout``): what a follower was given meanwhile it forwarded
into the stopped node, where it was lost, and its publishes failed "the Raft leader
changed" (a non-seed's at 2,000/s, through a follower: 363 and 1,174 in two runs). Now
the follower finds the link down before it writes the command, holds it, and gives it
to the next leader (cluster/raft_forward.py).

And what a stopped leader had sent its followers before it stopped may commit under the
next one: the follower that submitted it is never told it failed for sure -- a success
once it applies it, or an unknown outcome that a barrier settles after the commit
(cluster/raft_outcomes.py).
"""

from __future__ import annotations

import errno
from collections.abc import Iterator
from typing import Any

import pytest
from test_raft_forward_nodes import WAIT, Seeds, submit, ticked, wait_for

from cluster import raft as raft_module
from cluster.raft import DEFINITE_FAILURES, RaftCoordination, _fail_name
from cluster.raft_disk import RaftDiskFailure
from cluster.raft_transport import SeedLinkTransport

DEFINITE = {_fail_name(code) for code in DEFINITE_FAILURES}


@pytest.fixture
def seeds(monkeypatch: pytest.MonkeyPatch) -> Iterator[Seeds]:
    monkeypatch.setattr(raft_module, "SeedLinkTransport", SeedLinkTransport)
    made = Seeds()
    try:
        yield made
    finally:
        made.close()


def stop_at_next_compaction(node: RaftCoordination) -> None:
    """``node``'s disk is full at its next tick's compaction (the end of a tick: after
    it sent what it had to): its Raft node stops, as at a dump it cannot write."""
    syncobj = node.syncobj

    def full(*_: Any) -> None:
        raise RaftDiskFailure("/d/raft.dump.tmp", OSError(errno.ENOSPC, "No space left"))

    syncobj._SyncObj__tryLogCompaction = full


def survivors_apply_it_once(seeds: Seeds, stopped: RaftCoordination) -> None:
    live = [i for i, n in enumerate(seeds.nodes) if n is not stopped]
    wait_for(lambda: all(seeds.commits_of(1)[i] for i in live), "the survivors apply it")
    assert [seeds.commits_of(1)[i] for i in live] == [1, 1]
    assert seeds.commits_of(1)[seeds.nodes.index(stopped)] == 0  # (it applies nothing)


def test_a_command_given_to_a_follower_of_a_stopped_leader_commits_under_the_next(
    seeds: Seeds,
) -> None:
    leader = seeds.leader()
    follower = next(n for n in seeds.nodes if n is not leader)
    stop_at_next_compaction(leader)
    wait_for(lambda: leader.snapshot.stopped is not None, "the leader stopped")
    ticked(follower)  # it ticked since (a poll after the stop)
    linked = follower.snapshot.linked
    done, outcome = submit(follower, 1)
    assert done.wait(WAIT), "the command neither committed nor failed"
    assert outcome == [(None, False)], f"lost in the stopped leader (linked: {linked})"
    assert leader.address not in linked
    survivors_apply_it_once(seeds, leader)
    wait_for(lambda: follower.snapshot.forward_hold["released"] == 1, f"held and released: "
             f"{follower.snapshot.forward_hold}")


def test_what_a_stopped_leader_sent_commits_under_the_next_never_failed_for_sure(
    seeds: Seeds,
) -> None:
    """The leader appends a follower's command, sends it to both followers, and stops
    in that same tick, once they took it, before it reads their answers: the next
    leader commits it. The follower
    that submitted it hears a success or an unknown outcome, never a definite failure."""
    leader = seeds.leader()
    follower = next(n for n in seeds.nodes if n is not leader)
    syncobj = leader.syncobj
    send = syncobj._SyncObj__sendAppendEntries
    taken = syncobj._SyncObj__getCurrentLogIndex()

    others = [n for n in seeds.nodes if n is not leader]
    before = [n.snapshot.entries_taken for n in others]

    def send_then_stop() -> None:  # (on the leader's Raft thread)
        send()
        if syncobj._SyncObj__getCurrentLogIndex() > taken:  # the command is in its log
            wait_for(lambda: all(n.snapshot.entries_taken > b for n, b in zip(
                others, before, strict=True)), "both followers took it")  # (their threads)
            stop_at_next_compaction(leader)  # before it reads their answers

    syncobj._SyncObj__sendAppendEntries = send_then_stop
    done, outcome = submit(follower, 1)
    wait_for(lambda: leader.snapshot.stopped is not None, "the leader stopped")
    assert done.wait(WAIT), "the command's outcome never came"
    survivors_apply_it_once(seeds, leader)
    ((error, unknown),) = outcome
    assert error is None or (unknown and error not in DEFINITE), outcome
