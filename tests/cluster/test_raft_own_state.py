"""A Raft dump carries nothing of the node's own per-process state (cluster/raft_own_state.py):
real pysyncobj nodes on raft_sim's simulated clock and network."""

from __future__ import annotations

from pysyncobj.serializer import Serializer
from raft_sim import RaftWorld

from cluster.raft_follower import FollowerSafeSyncObj
from cluster.raft_own_state import REPLICATED_OWN, own_state_only


def test_a_dump_carries_nothing_of_the_nodes_own_state() -> None:
    """Before: each dump carried the writer's _stood_at, _doublings (read on its monotonic
    clock), _heard_leader_at, _pre_vote, _linked_once, _waiting_since; a seed that loaded one
    written on a machine up longer than its own raised OverflowError at every tick."""
    world = RaftWorld(3, node_class=FollowerSafeSyncObj, seed=4, compaction_entries=6,
                      send_seconds=0.004)
    try:
        for _ in range(100):
            world.step(0.05)
            if world.leader():
                break
        leader = world.leader()
        assert leader is not None
        for i in range(40):
            world.submit(leader, b"e%03d" % i)
            world.step(0.05)
        world.step(1.0)
        assert world.violations() == []
        owns = {}
        for address in world.addresses:
            path = str(world.dir / f"{address.replace(':', '_')}.dump")
            data = Serializer(path, 0, False, None, None, None).deserialize()
            owns[address] = sorted(data[0][0])
        assert all(set(own) <= REPLICATED_OWN for own in owns.values()), owns
        stood = world.nodes[leader].__dict__
        assert "_stood_at" in stood and "_heard_leader_at" in world.nodes[
            next(a for a in world.addresses if a != leader)].__dict__  # there to leave out
    finally:
        world.close()


def test_an_older_versions_dump_is_read_without_the_nodes_own_state() -> None:
    """A dump written before (524f73f's, this code's until now) still carries them."""
    consumer = {"coordinator": "state"}
    own = {"_SyncObj__enabledCodeVersion": 0, "_stood_at": 31687.0, "_doublings": 1,
           "_heard_leader_at": 31690.0, "_linked_once": True, "_waiting_since": None}
    data = ([own, consumer], ("entry", 9, 2), ("entry", 8, 2), {"a", "b"})
    read = own_state_only(data)
    assert read == ([{"_SyncObj__enabledCodeVersion": 0}, consumer], *data[1:])
    assert type(read) is tuple
    assert own_state_only((None, 1, 2, 3)) == (None, 1, 2, 3)
    assert own_state_only(([own], 1, 2, 3))[0] == [{"_SyncObj__enabledCodeVersion": 0}]
