"""A deposed leader catching up with the new leader's log (a liveness property).

pysyncobj 0.3.17's leader sends a follower everything from ``nextIndex`` on in one go,
cut into several AppendEntries when it is larger than ``appendEntriesBatchSizeBytes``
(an entry of that size or more goes alone, in parts). A follower whose entry at a
message's ``prevLogIdx`` has another term answers each message by resetting the
leader's ``nextIndex`` to that ``prevLogIdx``; the leader takes the replies in order,
so the *last* message's answer wins. When the entry at ``nextIndex`` is that large and
another entry follows it, every round sends [that entry, prev ``nextIndex - 1``] then
[what follows, prev ``nextIndex``], and the two answers set ``nextIndex`` to
``nextIndex - 1`` and back: the leader never goes further back, the follower never
catches up. It happens as well when the follower's log is shorter and ends in a
conflicting entry: the first message is refused at that entry, the next ones (past its
end) reset ``nextIndex`` to just after it -- the form the hypothesis search of
test_raft_safety.py ran into now and then ("acknowledged commands not applied on every
node").

The schedule: leader A is cut off and takes commands of its own (six, or one); B leads
with C, commits a large entry (followed by small ones); B dies and A comes back: C leads
with A's vote, and C and A must commit a new command. They do not: A stays behind, and two live
seeds of three commit nothing, until the leader compacts its log past ``nextIndex`` and
sends its dump instead (with compaction after 2 entries in :mod:`raft_sim` they commit
at once; not after 20). The seeds compact after 20,000 entries or 120 s
(``ClusterLogCompactionEntries``, ``ClusterLogCompactionTime``) and run with
``appendEntriesBatchSizeBytes`` = 64 KiB: one publish batch of that size at the wrong
index could stop commits for up to two minutes with one seed down.

Found by the schedule search (test_raft_safety.py) once a leader could be cut off from
the others. :class:`~cluster.raft_follower.FollowerSafeSyncObj` answers a mismatch
never above an earlier one of the same leader's term, and skips a whole run of entries
of the conflicting term at once: the deposed leader catches up in a round or two.
pysyncobj's own follower stays an expected failure (so a pysyncobj that fixes its
leader shows up here).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
from pysyncobj import SyncObj
from raft_sim import RaftWorld

from cluster.raft_follower import FollowerSafeSyncObj

BATCH_BYTES = 300
LARGE = b"L" * 700  # sent alone, in parts


def settle(world: RaftWorld, done: Callable[[], bool], rounds: int = 100) -> bool:
    for _ in range(rounds):
        world.step(0.05)
        if done():
            return True
    return False


def deposed_leader_rejoins(
    node_class: type[Any], own: int, values: tuple[bytes, ...]
) -> tuple[RaftWorld, str]:
    """The schedule above, up to C leading A (A took ``own`` commands, B ``values``); the
    world and A."""
    world = RaftWorld(3, node_class=node_class, batch_bytes=BATCH_BYTES, seed=1)
    for _ in range(20):
        world.step(0.05)
    a = world.leader()
    assert a is not None
    for other in world.addresses:
        world.cut(a, other)
    for i in range(own):
        world.submit(a, b"a%d" % i)  # A's own tail, never committed
    world.tick(a)
    assert settle(world, lambda: world.leader() not in (None, a))
    b = world.leader()
    assert b is not None
    c = next(address for address in world.addresses if address not in (a, b))
    for value in values:
        world.submit(b, value)
    assert settle(world, lambda: len(world.acknowledged) == len(values))
    world.crash(b)
    world.heal(a, c)
    assert settle(world, lambda: world.leader() == c)
    return world, a


PYSYNCOBJ_LIVELOCK = pytest.mark.xfail(
    strict=True,
    reason="pysyncobj 0.3.17: the last reply of a round resets nextIndex (livelock)",
)


@pytest.mark.parametrize(
    "node_class",
    [FollowerSafeSyncObj, pytest.param(SyncObj, marks=PYSYNCOBJ_LIVELOCK)],
    ids=["ours", "pysyncobj"],
)
@pytest.mark.parametrize(
    ("own", "values"),
    [(6, (b"b", LARGE, b"c", b"d")), (1, (LARGE, b"c", b"d"))],
    ids=["longer-tail", "one-entry"],
)
def test_two_live_seeds_commit_after_a_leader_change(
    node_class: type[Any], own: int, values: tuple[bytes, ...]
) -> None:
    world, deposed = deposed_leader_rejoins(node_class, own, values)
    try:
        leader = world.leader()
        assert leader is not None
        world.submit(leader, b"after")
        assert settle(world, lambda: b"after" in world.acknowledged), (
            f"{deposed} still holds its own tail: "
            f"{[(i, t) for _, i, t in world.nodes[deposed]._SyncObj__raftLog[:]]}"
        )
        assert world.violations() == []
    finally:
        world.close()
