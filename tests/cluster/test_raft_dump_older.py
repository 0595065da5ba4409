"""A follower sent a leader's dump older than what it holds never goes back.

pysyncobj's leader sends its dump to a follower whenever its next index for it falls
below the start of its log, and it rewinds that index on some replies and reconnections:
an up-to-date follower B is then sent a dump that ends before B's own log or applied
state. Each schedule here builds one such B on the Raft simulation (raft_sim.py: real
pysyncobj nodes, real journals and dumps), C cut off, the leader A's next index for B
rewound by hand, and varies where B stands against the dump's last entry L:

- B's log starts before L (it holds L: cluster/raft_dump_chunks.held_dump_end keeps the
  log, as test_raft_dump_kept_tail.py shows: these pass on the code before too), at L,
  or after L (B compacted past the dump: no entry L in its log, more in its state), or
  after L with a compaction of its own under way (its dump written, its journal trimmed
  at its next tick);
- B's log ends at what it applied, or holds two entries more that it has not applied:
  not acknowledged to A, or acknowledged and counted in A's commit;
- B restarts after the dump, or not.

Then A dies and C comes back: B, the only seed with every committed entry, is elected.
In every variant B's applied index never falls, its log keeps every entry it held (it
acknowledged them), it still holds them after a restart, and no safety check of the
simulation fails (nothing committed replaced, every acknowledged command applied where
it was acknowledged, every node ends with all of them).

On the code before, a B that had compacted past L loaded the dump: its state and applied
index went back from 16 to 10 ("raftCommitIndex (16) exceeds journal end (10) after
loading dump"), its log to the dump's entries 9 and 10 -- trimmed to nothing by its own
compaction under way, at its next tick; elected, it gave index 11 to another command
("sent entry 11 of term 3 over the entry of term 2 committed there"); restarted, its
data-dir check refused its journal ("ends at entry 10, but entry 13 was committed"). A B
whose log started at L kept its log, but the received dump had replaced its own
raft.dump: restarted, pysyncobj cleared the journal, which did not start at that dump
(B's log ended at 10, not 14); not restarted and elected, it sent C that dump, older
than its log: C's log stayed [9, 10] (not converged).

The seeded search at the end runs test_raft_safety.py's actions (weighted towards a
leader that commits), each node compacting at its own threshold, and one action in ten
setting the leader's next index for a follower back to the start of its log; a node that
loads a dump ending before what it has applied fails it. It finds the code before
(raft_planted.LoadsAnOlderDump, at seed 7) and nothing here (600 runs in a scratch run).
Hypothesis drawing the same (test_raft_safety.py's machine with a rewind rule and that
check as an invariant) did not find the code before in 100 examples: not kept.
"""

from __future__ import annotations

import itertools
import os
import random
from typing import Any

import pytest
from raft_planted import LoadsAnOlderDump
from raft_sim import RaftWorld
from test_raft_safety import LARGE, Schedule, seeded_actions

from cluster.raft_follower import FollowerSafeSyncObj

WHERE = {  # B's log starts at L + this; None: B compacts again, its journal not yet trimmed
    "log starts before L": -1, "log starts at L": 0, "compacted past L": 2,
    "compacting again": None,
}
TAILS = ("none", "not acknowledged", "acknowledged")
RUNS = 40
STAGGER = (2, 4, 7)  # entries before each node compacts
# test_raft_safety.py's actions, weighted towards a leader that commits (in their order:
# more rounds, commands at the leader and restarts; no pauses, no link cut alone, no node
# crashed by number, no lost disk)
COMMITS = (4, 0, 1, 1, 1, 0, 1, 1, 0, 2, 1, 1, 1, 4, 1, 1, 1, 0)


def log_of(world: RaftWorld, address: str) -> list[tuple[int, int]]:
    return [(index, term) for _, index, term in world.nodes[address]._SyncObj__raftLog[:]]


def settle(world: RaftWorld, steps: int) -> None:
    for _ in range(steps):
        world.step(0.05)


def compact(world: RaftWorld, address: str) -> None:
    """``address`` writes its dump now (synchronously here) and trims its journal."""
    world.nodes[address].forceLogCompaction()
    world.tick(address)
    world.tick(address)


class Scenario:
    """A leader A, a follower B, C cut off: B stands where a test puts it."""

    def __init__(self) -> None:
        self.world = world = RaftWorld(3, seed=3, compaction_entries=10**6,
                                       send_seconds=0.001)
        self.values = (b"v%03d" % i for i in itertools.count())
        settle(world, 20)
        leader = world.leader()
        assert leader is not None
        self.a = leader
        self.b, self.c = (x for x in world.addresses if x != leader)
        for other in world.addresses:
            world.cut(self.c, other)

    def submit(self, count: int) -> None:
        for _ in range(count):
            self.world.submit(self.a, next(self.values))
            settle(self.world, 1)
        settle(self.world, 2)

    def b_compacts(self, where: int, dump_end: int) -> None:
        """B's log starts at ``dump_end + where`` (B's dump ends one after it)."""
        world, b = self.world, self.b
        while world.nodes[b].raftLastApplied < dump_end + where + 1:
            self.submit(1)
        assert world.nodes[b].raftLastApplied == dump_end + where + 1
        compact(world, b)
        assert log_of(world, b)[0][0] == dump_end + where

    def b_holds_a_tail(self, acknowledged: bool) -> None:
        """Two more entries in B's log, not applied there; counted in A's commit or not."""
        world, a, b = self.world, self.a, self.b
        for _ in range(2):
            world.submit(a, next(self.values))
        world.tick(a)
        world.deliver(a, b, 10)
        if acknowledged:
            world.deliver(b, a, 10)
            world.tick(a)
        world.queues[(a, b)].clear()  # B learns nothing more (A's commit included)

    def a_sends_its_dump(self, b_ticks: bool) -> None:
        """A's next index for B rewound below A's log: A sends its dump, one message at a
        time, until B has the whole of it (B not ticking meanwhile: a compaction of its
        own is still to finish)."""
        world, a, b = self.world, self.a, self.b
        nodes = world.nodes[a]._SyncObj__raftNextIndex
        nodes[next(n for n in nodes if n.id == b)] = 1
        serializer = world.nodes[b]._SyncObj__serializer
        parts = world.dump_parts_sent
        for _ in range(40):
            world.clock.now += 0.01
            world.tick(a)
            world.deliver(a, b, 1)
            if b_ticks:
                world.tick(b)
            whole = serializer._Serializer__incomingTransmissionFile is None
            if world.dump_parts_sent > parts and whole:
                return
        raise AssertionError("B never received A's dump")


@pytest.mark.parametrize("restart", [False, True], ids=["", "B restarts"])
@pytest.mark.parametrize("tail", TAILS)
@pytest.mark.parametrize("where", list(WHERE))
def test_a_follower_sent_an_older_dump_never_goes_back(where: str, tail: str,
                                                      restart: bool) -> None:
    s = Scenario()
    world, a, b, c = s.world, s.a, s.b, s.c
    try:
        s.submit(8)
        compact(world, a)
        dump_end = log_of(world, a)[1][0]
        s.b_compacts(WHERE[where] or 2, dump_end)
        s.submit(3)
        if tail != "none":
            s.b_holds_a_tail(acknowledged=tail == "acknowledged")
        if WHERE[where] is None:  # its dump written, its journal trimmed at its next tick
            world.nodes[b].forceLogCompaction()
            world.tick(b)
            assert log_of(world, b)[0][0] == dump_end + 2
        held, applied = log_of(world, b)[-1][0], world.nodes[b].raftLastApplied
        assert held > applied or tail == "none"
        assert world.nodes[a].raftCommitIndex == (held if tail == "acknowledged" else applied)

        s.a_sends_its_dump(b_ticks=WHERE[where] is not None)
        assert world.nodes[b].raftLastApplied >= applied, "B's state went back"
        assert ("restored", dump_end) not in world.lives[b], "B loaded the older dump"
        world.tick(b)  # (its own compaction, if one was under way, ends here)
        assert log_of(world, b) and log_of(world, b)[-1][0] >= held, "B dropped its log"
        if restart:
            world.crash(b)
            world.restart(b)
            world.tick(b)
            assert log_of(world, b)[-1][0] >= held, "B lost its log by restarting"
        assert world.violations() == []

        world.crash(a)
        for other in world.addresses:
            world.heal(c, other)
        for i in range(10):
            leader = world.leader()
            if leader is not None:
                assert leader == b  # (C lacks what B holds: only B can be elected)
                world.submit(leader, b"w%03d" % i)
            world.step(0.05)
        settle(world, 60)
        assert world.violations() == []
        world.restart(a)
        settle(world, 60)
        assert world.violations() == []
        assert world.converged()
    finally:
        world.close()



# --- a seeded search with rewinds -------------------------------------------------------

REWINDS = 0.1  # of the actions: the leader's next index for a follower set back


def rewind(schedule: Schedule, follower: int) -> None:
    """pysyncobj's leader sets its next index for a follower back to the start of its
    log: once it has compacted, it sends its dump, whatever the follower holds."""
    world = schedule.world
    leader = world.leader()
    if leader is not None:
        node = world.nodes[leader]
        dumped = os.path.exists(node._SyncObj__conf.fullDumpFile)
        nodes = node._SyncObj__raftNextIndex
        first = node._SyncObj__raftLog[0][1]
        nodes[sorted(nodes, key=lambda n: n.id)[follower]] = first + (not dumped)
        world.step(0.05)  # (the dump on its way)


def staggered(world: RaftWorld) -> None:
    """Each node compacts at its own threshold (as seeds do: raft_compaction.py's
    compaction_stagger), so a follower's dump is often newer than its leader's."""
    for address, node in world.nodes.items():
        node._SyncObj__conf.logCompactionMinEntries = STAGGER[world.addresses.index(address)]


def went_back(world: RaftWorld) -> list[str]:
    """Each node that, since it started, loaded a dump ending before what it had applied."""
    problems = []
    for address, life in world.lives.items():
        reached = 0
        for what, index in life:
            if what == "restored" and index < reached:
                problems.append(f"{address} went back from {reached} to a dump at {index}")
            reached = max(reached, index)
    return problems


def rewinds_search(node_class: type[Any], runs: int) -> list[str]:
    """The compaction search of test_raft_safety.py (its actions weighted as
    :data:`COMMITS`), each node compacting at its own threshold, with :func:`rewind` as
    one action in ten; the first schedule's problems, or []."""
    batch_sizes, command_sizes = LARGE
    for seed in range(runs):
        rng = random.Random(seed)
        schedule = Schedule(node_class, rng.choice(batch_sizes), seed, compaction=True)
        pick = seeded_actions(rng, command_sizes, COMMITS)
        try:
            for _ in range(60):
                staggered(schedule.world)
                if rng.random() < REWINDS:
                    rewind(schedule, rng.randrange(2))
                else:
                    pick(schedule)
                if schedule.world.violations() or went_back(schedule.world):
                    break
            problems = (schedule.world.violations() or went_back(schedule.world)
                        or schedule.finish())
            if problems:
                return [f"seed {seed}", *problems]
        finally:
            schedule.world.close()
    return []


def test_the_search_with_rewinds_finds_nothing_wrong() -> None:
    assert rewinds_search(FollowerSafeSyncObj, runs=RUNS) == []


def test_the_search_with_rewinds_finds_the_older_dump_loaded() -> None:
    problems = rewinds_search(LoadsAnOlderDump, runs=RUNS)
    assert any("committed there" in p or "went back" in p for p in problems), problems
