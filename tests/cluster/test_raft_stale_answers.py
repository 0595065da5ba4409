"""A follower behind the leader's log is sent the dump once, however many answers it
still owes (cluster/raft_stale_answers.py); a stale reset never lowers the leader's match
index nor its commit; and the follower's catch-up floor (cluster/raft_follower.py,
``_go_back``) never outlives its catch-up.

On the Raft simulation (raft_sim.py), as in test_raft_dump_older.py: a leader A, a
follower B, C cut off while A commits and compacts, then linked again, A's next index for
C where pysyncobj's leader leaves it for a follower linked but silent (past its log). C
answers each AppendEntries with "reset to 3" (its log's end + 1, below A's log); its
answers arrive one a round, ``owed`` of them in flight when the first arrives.
"""

from __future__ import annotations

import pickle
from typing import Any

import pytest
from raft_planted import KeepsItsCatchUpFloor
from test_raft_dump_older import Scenario, compact, log_of, settle

from cluster.raft_follower import FollowerSafeSyncObj


def node_of(world: Any, leader: str, address: str) -> Any:
    return next(n for n in world.nodes[leader]._SyncObj__raftNextIndex if n.id == address)


def c_catches_up(s: Scenario, owed: int) -> list[int]:
    """C linked again with ``owed`` AppendEntries in flight; each round A ticks, C takes
    what A sent, and one of C's answers reaches A. The dump parts sent after each round."""
    world, a, c = s.world, s.a, s.c
    s.submit(8)
    compact(world, a)
    s.submit(3)
    world.heal(a, c)
    leader = world.nodes[a]
    leader._SyncObj__raftNextIndex[node_of(world, a, c)] = log_of(world, a)[-1][0] + 1
    parts, sent = world.dump_parts_sent, []
    for i in range(24):
        world.clock.now += 0.045
        world.tick(a)
        world.deliver(a, c, 10**6)
        world.tick(c)
        if i >= owed - 1:
            world.deliver(c, a, 1)
        sent.append(world.dump_parts_sent - parts)
    return sent


@pytest.mark.parametrize("owed", [1, 2, 3])
def test_a_follower_behind_the_log_is_sent_the_dump_once(owed: int) -> None:
    s = Scenario()
    world, a, c = s.world, s.a, s.c
    try:
        sent = c_catches_up(s, owed)
        assert sent[-1] == 1, f"A sent its dump {sent[-1]} times: {sent}"
        assert [x for x in world.lives[c] if x[0] == "restored"] == [("restored", 10)]
        match = world.nodes[a]._SyncObj__raftMatchIndex[node_of(world, a, c)]
        assert match == log_of(world, a)[-1][0] == log_of(world, c)[-1][0]
        assert world.violations() == []
    finally:
        world.close()


def test_a_stale_reset_lowers_no_match_index_and_moves_no_commit() -> None:
    """A reset from B below what B acknowledged (here, planted: one that no link in
    order delivers) rewinds A's next index only: A's match index for B and its commit
    stay, A sends B its dump, and B keeps its log against it."""
    s = Scenario()
    world, a, b = s.world, s.a, s.b
    try:
        s.submit(8)
        compact(world, a)
        s.submit(3)
        leader, node = world.nodes[a], node_of(world, a, b)
        match, commit = leader._SyncObj__raftMatchIndex[node], leader._SyncObj__raftCommitIndex
        assert match == commit == log_of(world, a)[-1][0] == 13
        stale = {"type": "next_node_idx", "next_node_idx": 3, "reset": True, "success": False}
        world.queues[(b, a)].append(pickle.dumps(stale))
        parts = world.dump_parts_sent
        world.deliver(b, a, 1)
        assert leader._SyncObj__raftNextIndex[node] == 3
        assert leader._SyncObj__raftMatchIndex[node] == match
        settle(world, 5)
        assert world.dump_parts_sent == parts + 1  # (the cost: a whole dump)
        assert leader._SyncObj__raftMatchIndex[node] == match
        assert leader._SyncObj__raftCommitIndex == commit
        assert not [x for x in world.lives[b] if x[0] == "restored"], "B loaded the dump"
        s.submit(2)
        assert leader._SyncObj__raftCommitIndex == commit + 2
        assert world.violations() == []
    finally:
        world.close()


def floor_after_catch_up(node_class: type[Any]) -> tuple[Any, int]:
    """C catches up from A's dump with a floor set before it (its "reset to 3"); then A's
    next index for C goes past C's log (pysyncobj's leader moves it as it sends): the
    floor C holds then, and the dump parts A sends after C's mismatch answer."""
    s = Scenario()
    world, a, c = s.world, s.a, s.c
    try:
        world.crash(c)  # C runs node_class from here on (still cut off)
        world.node_class = node_class
        world.restart(c)
        c_catches_up(s, owed=2)
        floor = world.nodes[c]._catch_up_floor
        end = log_of(world, a)[-1][0]
        world.nodes[a]._SyncObj__raftNextIndex[node_of(world, a, c)] = end + 3
        parts = world.dump_parts_sent
        settle(world, 10)
        assert world.violations() == []
        return floor, world.dump_parts_sent - parts
    finally:
        world.close()


def test_the_catch_up_floor_never_outlives_the_catch_up() -> None:
    """C's floor (the "reset to 3" it answered before the dump) is gone once C answered
    A's first AppendEntries after the dump (which C holds: the dump's end); a later
    mismatch is answered from C's log, and A sends entries, not its dump again. A C that
    kept the floor (planted) sends A below its log: the dump again."""
    assert floor_after_catch_up(FollowerSafeSyncObj) == (None, 0)
    floor, dumps = floor_after_catch_up(KeepsItsCatchUpFloor)
    assert floor is not None and floor[1] == 3 and dumps == 1
