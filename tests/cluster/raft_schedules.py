"""Set-ups the Raft simulation tests share (on :class:`raft_sim.RaftWorld`)."""

from __future__ import annotations

import random

from raft_sim import RaftWorld


def left_behind(world: RaftWorld, *, entries: int, size: int, seed: int) -> tuple[str, str]:
    """Elect a leader, cut one other node off while ``entries`` commands of ``size``
    random bytes commit (a node compacting meanwhile leaves it needing the dump), then
    link it again: (leader, the node left behind)."""
    rnd = random.Random(seed)
    for _ in range(20):
        world.step(0.05)
    leader = world.leader()
    assert leader is not None
    behind = next(address for address in world.addresses if address != leader)
    for other in world.addresses:
        world.cut(behind, other)
    for i in range(entries):
        if world.leader():
            world.submit(world.leader(), b"v%03d" % i + rnd.randbytes(size))
        world.step(0.05)
    for other in world.addresses:
        world.heal(behind, other)
    return leader, behind
