"""Partial partitions: some links between seeds down, the others up (real pysyncobj nodes
with our follower, on the simulated network and clock of :mod:`raft_sim`).

The chaos nemesis cuts a member off from everyone; these cut single links, the case a
NetworkPolicy or one bad route makes. What holds (a publish is submitted to the current
leader every 50 ms for 10 simulated seconds, seeds 0-3):

- pysyncobj has no pre-vote: a seed that cannot hear the leader stood again and again and
  its higher term deposed the leader -- 12-15 elections in 10 s with fixed timeouts, 1-4
  with the back-off (cluster/raft_election_timer.py, ``ElectionBackoff``). With pre-vote
  (cluster/raft_prevote.py) the seeds that hear the leader refuse it: none;
- five seeds in a ring (each linked to its two neighbours): the leader reaches a majority
  and keeps it, 0 elections (3-4 before pre-vote, terms +10-12); where the leader keeps
  one link only it has no majority and steps down (``leaderFallbackTimeout``): exactly
  one election moves the lead (1-4 before, terms +3-10);
- three seeds, the leader's link to one follower down: the leader keeps its lead (before
  pre-vote it moved to the seed that reaches both after 1-2 elections); the cut-off seed
  gets no log until the link is back, then catches up. A publish in flight at a
  deposition waits for its outcome (cluster/raft_outcomes.py): acknowledged if it
  committed, else ``PUBLISH_FAILED`` for the client to retry. Nothing unsafe in any.
"""

from __future__ import annotations

import itertools

import pytest
from raft_sim import RaftWorld

STEP = 0.05


def elect(world: RaftWorld) -> str:
    for _ in range(60):
        world.step(STEP)
    leader = world.leader()
    assert leader is not None
    return leader


def publish_for(world: RaftWorld, seconds: float) -> tuple[int, int, int]:
    """Submit to the current leader every step: (submitted, acknowledged, elections won:
    how many times a seed took the lead, itself again after losing it included)."""
    before = len(world.acknowledged)
    submitted, elections = 0, 0
    leader = world.leader()
    last = None if leader is None else (leader, world.nodes[leader].raftCurrentTerm)
    for i in range(int(seconds / STEP)):
        leader = world.leader()
        term = None if leader is None else world.nodes[leader].raftCurrentTerm
        if leader is not None and (leader, term) != last:
            elections += 1
        last = None if leader is None else (leader, term)
        if leader is not None:
            world.submit(leader, b"p%d" % i)
            submitted += 1
        world.step(STEP)
    return submitted, len(world.acknowledged) - before, elections


@pytest.mark.parametrize("seed", [0, 1, 2, 3])
def test_three_seeds_with_one_link_down_keep_their_leader(seed: int) -> None:
    world = RaftWorld(3, seed=seed)
    try:
        leader = elect(world)
        term = world.nodes[leader].raftCurrentTerm
        cut_off = next(a for a in world.addresses if a != leader)
        world.cut(leader, cut_off)
        submitted, acknowledged, elections = publish_for(world, 10.0)
        assert (elections, world.leader()) == (0, leader)  # before pre-vote: 1-2, the bridge
        assert max(n.raftCurrentTerm for n in world.nodes.values()) == term
        assert acknowledged >= 0.9 * submitted
        # it knows it has no leader (so its member is not ready: cluster/seed.py)
        assert world.nodes[cut_off]._SyncObj__raftLeader is None
        world.heal_all()
        for _ in range(20):
            world.step(STEP)
        assert world.leader() == leader
        assert world.converged(), "a seed misses acknowledged entries"  # the cut-off one too
        assert world.violations() == []
    finally:
        world.close()


@pytest.mark.parametrize("seed", [0, 1, 2, 3])
@pytest.mark.parametrize(("shape", "needed"), [("leader-keeps-one-link", 1), ("ring", 0)])
def test_five_seeds_in_a_partial_partition_keep_committing_safely(
    shape: str, needed: int, seed: int
) -> None:
    """``needed``: the elections the shape needs (a leader with one link of four has no
    majority and steps down); a seed that cannot hear a leader holds none more."""
    world = RaftWorld(5, seed=seed)
    try:
        leader = elect(world)
        addresses = world.addresses
        if shape == "ring":
            for a, b in itertools.combinations(range(5), 2):
                if (b - a) % 5 not in (1, 4):
                    world.cut(addresses[a], addresses[b])
        else:
            for other in [a for a in addresses if a != leader][1:]:
                world.cut(leader, other)
        submitted, acknowledged, elections = publish_for(world, 10.0)
        assert acknowledged >= 0.9 * submitted
        assert elections == needed  # before pre-vote: 1-4 (12-15 without the back-off)
        world.heal_all()
        for _ in range(60):
            world.step(STEP)
        assert world.converged()
        assert world.violations() == []
    finally:
        world.close()
