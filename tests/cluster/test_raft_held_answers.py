"""A follower answers the AppendEntries of one poll after one sync
(cluster/raft_held_answers.py)."""

from __future__ import annotations

import os
from typing import Any

import pytest
from raft_sim import simulated
from test_raft_follower import LEADER, entries, follower

from cluster import raft_durability
from cluster.raft_follower import FollowerSafeSyncObj

PUBLISHES = 20


def test_the_appendentries_waiting_for_a_follower_cost_it_one_sync(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """20 publishes, each sent at once (appendEntriesUseBatch off), wait for a follower
    whose Raft thread was in a sync (a disk that stalls): read in one poll, they cost it
    one sync, then one answer each, the last vouching for all. Before: a sync each (20
    stalls of 1-3 s on such a disk, where one does)."""
    synced: list[str] = []
    sync_file = raft_durability.sync_file

    def counted(fd: int) -> None:
        synced.append(os.readlink(f"/proc/self/fd/{fd}"))
        sync_file(fd)

    with simulated(3, node_class=FollowerSafeSyncObj) as world:
        for _ in range(20):
            world.step(0.05)
        leader = world.leader()
        assert leader is not None
        behind = next(a for a in world.addresses if a != leader)
        for index in range(PUBLISHES):
            world.submit(leader, b"p%d" % index)
            world.tick(leader)  # (sent at once: one AppendEntries a publish)
        waiting = len(world.queues[(leader, behind)])
        assert waiting >= PUBLISHES
        monkeypatch.setattr(raft_durability, "sync_file", counted)
        world.deliver(leader, behind, 10**9)  # one poll reads them all
        journal = behind.replace(":", "_") + ".journal"
        assert [path for path in synced if path.endswith(journal)] == [synced[0]], synced
        answers = list(world.queues[(behind, leader)])
        assert len(answers) == waiting
        for _ in range(20):
            world.step(0.05)
        assert world.violations() == []
        assert world.converged()


def test_a_held_answer_past_a_cut_of_the_log_is_dropped() -> None:
    """In one poll: a leader's entries 2-3 (answer held: "I hold up to 3"), then a new
    leader's entry 2 of its term, which cuts the log at 2. "I hold up to 3" would now be
    false: it never leaves; the answers before the cut and after it do."""
    node = follower(FollowerSafeSyncObj)
    try:
        sent: list[Any] = node._SyncObj__transport.sent
        for term, new in ((1, [(2, 1, b"a"), (3, 1, b"b")]), (2, [(2, 2, b"c")])):
            FollowerSafeSyncObj._SyncObj__onMessageReceived(node, LEADER, {  # (not polled)
                "type": "append_entries", "term": term, "commit_index": 0,
                "entries": [(command, idx, t) for idx, t, command in new],
                "prevLogIdx": 1, "prevLogTerm": 0,
            })
        assert sent == []  # held until the end of the poll
        node._send_held_answers()
        assert [(m["next_node_idx"], m["success"]) for m in sent] == [(3, True)]
        assert entries(node)[1:] == [(2, 2, b"c")]
    finally:
        node.destroy()


def test_a_held_answer_carries_the_term_of_the_appendentries_it_answers() -> None:
    """In one poll: the leader of term 1's entry 2, then the leader of term 2's heartbeat
    (the term moves to 2 before the held answers leave). Each answer carries the term of
    the AppendEntries it answers (cluster/raft_answer_terms.py): "I hold up to 2" is term
    1's word, which a leader of term 2 drops; the term when it left would have been 2."""
    node = follower(FollowerSafeSyncObj)
    try:
        sent: list[Any] = node._SyncObj__transport.sent
        for term, new in ((1, [(b"a", 2, 1)]), (2, [])):
            FollowerSafeSyncObj._SyncObj__onMessageReceived(node, LEADER, {  # (not polled)
                "type": "append_entries", "term": term, "commit_index": 0,
                "entries": new, "prevLogIdx": 1 + (not new), "prevLogTerm": 0 if new else 1,
            })
        node._send_held_answers()
        assert [(m["next_node_idx"], m["success"], m["term"]) for m in sent] == [
            (3, True, 1), (3, True, 2)]
    finally:
        node.destroy()
