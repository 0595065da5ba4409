"""Partial partitions: some links between seeds down, the others up (real pysyncobj nodes
with our follower, on the simulated network and clock of :mod:`raft_sim`).

The chaos nemesis cuts a member off from everyone; these cut single links, the case a
NetworkPolicy or one bad route makes. What holds (2026-11-27; a publish is submitted to
the current leader every 50 ms for 10 simulated seconds):

- three seeds, the leader's link to one follower down (the other follower a *bridge*):
  the lead moves to the bridge, which reaches both, after 1-3 elections, and every seed
  keeps the log (the cut-off one through the bridge);
- five seeds where the leader keeps one link only, or a ring (each seed linked to its two
  neighbours): pysyncobj has no PreVote, so a seed that cannot hear the leader stands
  again and again and its higher term deposes the leader: 12-15 elections in 10 s (the
  same seed mostly winning again; terms near 90 after 20 s) with fixed timeouts; since
  each candidacy doubles the seed's timeouts (cluster/raft_election_timer.py,
  ``ElectionBackoff``) 1-4 elections in 10 s (terms 4-13), 95-99.5 % acknowledged
  (seeds 0-3), and nothing unsafe. A publish in flight
  at a deposition waits for its outcome (cluster/raft_outcomes.py): acknowledged if it
  committed, else ``PUBLISH_FAILED`` for the client to retry.
  PreVote, or "ignore votes while a leader is heard", would stop the churn in those two
  shapes but shut the cut-off seed out of the three-seed bridge instead of moving the
  lead to the bridge; not done.
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
def test_three_seeds_with_one_link_down_move_the_leader_to_the_bridge(seed: int) -> None:
    world = RaftWorld(3, seed=seed)
    try:
        leader = elect(world)
        cut_off, bridge = [a for a in world.addresses if a != leader]
        world.cut(leader, cut_off)
        submitted, acknowledged, elections = publish_for(world, 10.0)
        assert world.leader() == bridge and elections <= 3
        assert acknowledged >= 0.9 * submitted
        for _ in range(10):
            world.step(STEP)
        assert world.converged(), "a seed misses acknowledged entries"  # the cut-off one too
        assert world.violations() == []
    finally:
        world.close()


@pytest.mark.parametrize("shape", ["leader-keeps-one-link", "ring"])
def test_five_seeds_in_a_partial_partition_keep_committing_safely(shape: str) -> None:
    world = RaftWorld(5, seed=0)
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
        assert elections <= 5  # the churn held down by the back-off (12-15 without it)
        world.heal_all()
        for _ in range(60):
            world.step(STEP)
        assert world.converged()
        assert world.violations() == []
    finally:
        world.close()
