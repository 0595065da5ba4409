"""A follower sent the leader's dump keeps the entries it holds after the dump's last
entry (Raft, InstallSnapshot: "if existing log entry has same index and term as
snapshot's last included entry, retain log entries following it").

Without it (cluster/raft_follower.py ``_holds_the_dumps_end``) the follower dropped entries
27..28, committed with its acknowledgement; the leader died, the follower was elected
and gave index 27 to another command: "sent entry 27 of term 4 over the entry of term 2
committed there"."""

from __future__ import annotations

import random
from typing import Any

from raft_sim import RaftWorld


def node_of(world: RaftWorld, holder: str, address: str) -> Any:
    return next(n for n in world.nodes[holder]._SyncObj__raftNextIndex if n.id == address)


def test_a_follower_sent_an_older_dump_keeps_what_it_acknowledged() -> None:
    rnd = random.Random(1)
    world = RaftWorld(3, seed=3, compaction_entries=6, dump_part_bytes=2**16,
                      send_seconds=0.001)
    try:
        for _ in range(20):
            world.step(0.05)
        leader = world.leader()
        assert leader is not None
        b, c = (a for a in world.addresses if a != leader)
        for other in world.addresses:
            world.cut(c, other)
        for i in range(26):
            world.submit(leader, b"v%03d" % i + rnd.randbytes(50))
            world.step(0.05)
        held = world.nodes[b]._SyncObj__raftLog[-1][1]
        dump_index = world.nodes[leader]._SyncObj__raftLog[0][1] + 1
        assert held > dump_index + 1, (held, dump_index)
        # the leader rewinds its next index for B below its log (pysyncobj does on some
        # replies and reconnections): it sends B its dump, older than what B holds
        world.nodes[leader]._SyncObj__raftNextIndex[node_of(world, leader, b)] = 1
        installed, node, answers = world.dumps_installed, world.nodes[b], []
        looked = getattr(node, "_holds_the_dumps_end", None)
        if looked is not None:  # (the code before has no such step: it always loads)
            node._holds_the_dumps_end = lambda: answers.append(looked()) or answers[-1]
        for _ in range(40):  # one message at a time, until B has the whole dump
            world.clock.now += 0.01
            world.tick(leader)
            world.deliver(leader, b, 1)
            world.tick(b)
            if answers or world.dumps_installed > installed:
                break
        if looked is not None:  # (pysyncobj pickles a node's attributes into its dumps)
            del node._holds_the_dumps_end
        assert answers or world.dumps_installed > installed, "B was sent the dump"
        assert answers == [] or answers[0] < held
        assert world.nodes[b]._SyncObj__raftLog[-1][1] >= held, "B dropped what it acknowledged"
        # the leader goes; C comes back: B and C elect, and must keep what was committed
        world.crash(leader)
        for other in world.addresses:
            world.heal(c, other)
        for i in range(10):
            if world.leader():
                world.submit(world.leader(), b"w%03d" % i)
            world.step(0.05)
        for _ in range(60):
            world.step(0.05)
        assert world.violations() == []
        world.restart(leader)
        for _ in range(60):
            world.step(0.05)
        assert world.violations() == []
        assert world.converged()
    finally:
        world.close()
