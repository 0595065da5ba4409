"""Pre-vote in real pysyncobj nodes (cluster/raft_prevote_node.py), on the simulated
network and clock of :mod:`raft_sim`: a thawed follower, a failover, a rolling upgrade."""

from __future__ import annotations

import itertools
from typing import Any

import pytest
from pysyncobj import SyncObj, SyncObjConf
from pysyncobj.syncobj import _RAFT_STATE
from raft_sim import RaftWorld
from test_raft_follower import Unconnected, tick_stopped_midway
from test_raft_partial_partitions import STEP, elect

from cluster.raft_follower import FollowerSafeSyncObj
from cluster.raft_prevote import ANSWER, REQUEST, Campaign, Decision


def with_old_seeds(old: set[str]) -> type[Any]:
    """The follower, with the seeds at ``old`` running the version before pre-vote (they
    ignore its messages and stand at their deadline, as pysyncobj does)."""

    class Mixed(FollowerSafeSyncObj):
        def __init__(self, address: str, *args: Any, **kwargs: Any) -> None:
            self.pre_vote_enabled = address not in old
            super().__init__(address, *args, **kwargs)

    return Mixed


def frozen_step(world: RaftWorld, frozen: str, seconds: float) -> None:
    """Time passes with ``frozen`` stopped (SIGSTOP, a CPU limit): it neither ticks nor
    reads; what the others send it waits in its socket."""
    world.clock.now += seconds
    for address in list(world.nodes):
        if address != frozen:
            world.tick(address)
    while sum(world.deliver(s, t, 10**9) for s, t in list(world.queues) if frozen not in (s, t)):
        pass


def terms(world: RaftWorld) -> int:
    return max(node.raftCurrentTerm for node in world.nodes.values())


@pytest.mark.parametrize("pre_vote", [True, False])
def test_a_follower_frozen_past_its_timeout_does_not_depose_the_leader(pre_vote: bool) -> None:
    """benchmarks/cluster_spurious_elections.py --load throttle: a follower the kernel
    stops for longer than its election timeout finds its deadline passed when it runs
    again, before it reads what the leader sent meanwhile. Without pre-vote (the version
    before, ``pre_vote=False``) it stood, and its term deposed the live leader -- each
    time; now it asks first, the other follower heard the leader and says no."""
    everyone = {f"127.0.0.1:{i}" for i in (1, 2, 3)}
    world = RaftWorld(3, seed=1, node_class=with_old_seeds(set() if pre_vote else everyone))
    try:
        leader = elect(world)
        term = terms(world)
        for freeze in range(3):
            follower = next(a for a in world.addresses if a != world.leader())
            for _ in range(26):  # 1.3 s stopped: past its timeout, doubled twice at most here
                frozen_step(world, follower, STEP)
            world.tick(follower)  # it runs again: its deadline first
            for _ in range(4):
                world.step(STEP)
            world.submit(world.leader() or leader, b"after freeze %d" % freeze)
            world.step(STEP)
        if pre_vote:
            assert (world.leader(), terms(world)) == (leader, term)
            assert world.nodes[follower].pre_vote_campaign().round >= 3  # it did ask
        else:
            assert terms(world) == term + 3  # a deposition each time (what pre-vote ends)
        for _ in range(10):
            world.step(STEP)
        assert world.converged() and world.violations() == []
    finally:
        world.close()


@pytest.mark.parametrize("seed", range(6))
def test_a_dead_leader_is_replaced_at_the_first_seeds_timeout(seed: int) -> None:
    """A failover is as quick as before: the followers heard the dead leader last, so the
    first one whose timeout passes gets every yes at once and wins the one election --
    a round trip later than without pre-vote (here one 5 ms step)."""
    world = RaftWorld(3, seed=seed)
    try:
        leader = elect(world)
        term = terms(world)
        world.crash(leader)
        first = min(n._SyncObj__raftElectionDeadline for n in world.nodes.values())
        new = None
        while new is None and world.clock.now < first + 0.1:
            world.step(0.005)
            new = world.leader()
        assert new is not None and world.clock.now <= first + 0.010 + 1e-9
        assert terms(world) == term + 1  # one election, no round lost
    finally:
        world.close()


def test_pysyncobj_ignores_the_pre_vote_messages() -> None:
    """What a seed of the version before does with them (it hands every message it does
    not handle itself to pysyncobj): nothing -- no answer, no error, no term. The
    rolling upgrade rests on that (cluster/raft_prevote.py)."""
    node: Any = SyncObj("127.0.0.1:47951", ["127.0.0.1:47952", "127.0.0.1:47953"],
                        conf=SyncObjConf(autoTick=False), transportClass=Unconnected)
    try:
        peer = sorted(node.otherNodes, key=str)[0]
        for message in (
            {"type": REQUEST, "term": 7, "round": 1, "last_log_term": 9, "last_log_index": 9},
            {"type": ANSWER, "term": 7, "proposed_term": 7, "round": 1, "granted": True},
        ):
            node._SyncObj__onMessageReceived(peer, message)
        assert node._SyncObj__transport.sent == [] and node.raftCurrentTerm == 0
    finally:
        node.destroy()


def test_a_follower_stopped_midway_through_a_tick_asks_before_it_stands(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The decision is made at pysyncobj's own check of the deadline. Made earlier in
    the tick (this module's first version), a follower stopped between the two found
    its deadline passed at pysyncobj's and stood without asking: the frozen follower of
    benchmarks/cluster_spurious_elections.py --load throttle still deposed its leader."""
    node: Any = FollowerSafeSyncObj(
        "127.0.0.1:47961", ["127.0.0.1:47962", "127.0.0.1:47963"],
        conf=SyncObjConf(autoTick=False), transportClass=Unconnected,
    )
    try:
        node._term_quorum.waiting = False
        node._empty_start.active = False  # a seed with its disk (cluster/raft_votes.py)
        tick_stopped_midway(node, monkeypatch)
        assert node._SyncObj__raftState == _RAFT_STATE.FOLLOWER  # before: CANDIDATE
        assert node._SyncObj__raftCurrentTerm == 2
        sent = node._SyncObj__transport.sent
        assert [m["type"] for m in sent] == [REQUEST, REQUEST]
        assert {m["term"] for m in sent} == {3}
    finally:
        node.destroy()


def mixes() -> list[tuple[int, set[str]]]:
    """(seeds, those of the version before): every mix of three, some of five."""
    def mix(size: int) -> list[tuple[int, set[str]]]:
        addresses = [f"127.0.0.1:{i + 1}" for i in range(size)]
        return [(size, set(c)) for n in range(1, size)
                for c in itertools.combinations(addresses, n)]
    return mix(3) + mix(5)[::5]


@pytest.mark.parametrize(("size", "old"), mixes(), ids=lambda v: str(v) if isinstance(
    v, int) else "old-" + "-".join(sorted(a.rsplit(":", 1)[1] for a in v)))
def test_a_mixed_cluster_elects_when_its_leader_dies(size: int, old: set[str]) -> None:
    """A rolling upgrade: whichever seeds still run the version before, the cluster
    elects a leader at start, and again when the leader dies, and commits."""
    world = RaftWorld(size, seed=len(old), node_class=with_old_seeds(old))
    try:
        leader = elect(world)
        world.crash(leader)
        new = elect(world)
        world.submit(new, b"after the failover")
        for _ in range(10):
            world.step(STEP)
        assert b"after the failover" in world.acknowledged
        world.restart(leader)
        for _ in range(20):
            world.step(STEP)
        assert world.converged() and world.violations() == []
    finally:
        world.close()


AT_DEADLINE = Campaign.at_deadline


def silence_is_a_no(self: Campaign, current_term: int, linked: Any) -> Decision:
    """Planted: every seed asked is taken to run the rule, so its silence is a no."""
    self.speaks_prevote |= self.asked
    return AT_DEADLINE(self, current_term, linked)


@pytest.mark.parametrize("plant", [False, True], ids=["as-is", "silence-is-a-no"])
def test_a_new_seed_whose_log_alone_can_win_is_not_stuck_behind_an_old_one(
    monkeypatch: pytest.MonkeyPatch, plant: bool,
) -> None:
    """Three seeds: the leader dies, the survivors are a new seed with the longer log and
    an old seed behind it. The old seed stands at every timeout and loses (its log is
    behind), raising the term each time; the new seed's pre-vote gets no answer from it.
    Counting the silence of a seed that never answered a pre-vote as a yes, the new seed
    stands a round later and wins; counting it as a no (planted) leaves the cluster
    without a leader."""
    if plant:
        monkeypatch.setattr(Campaign, "at_deadline", silence_is_a_no)
    old = "127.0.0.1:3"
    world = RaftWorld(3, seed=2, node_class=with_old_seeds({old}))
    try:
        leader = elect(world)
        if leader == old:  # let a new seed lead (the old one comes back as old)
            world.crash(old)
            leader = elect(world)
            world.restart(old)
            elect(world)
        assert leader != old
        new = next(a for a in world.addresses if a not in (leader, old))
        world.cut(leader, old)  # the old seed falls behind
        for i in range(5):
            world.submit(leader, b"behind %d" % i)
            world.step(STEP)
        world.crash(leader)
        world.heal(leader, old)
        elected = None
        for _ in range(100):  # 5 s
            world.step(STEP)
            elected = world.leader()
            if elected is not None:
                break
        assert elected == (None if plant else new)
        assert world.violations() == []
    finally:
        world.close()


def test_an_empty_seed_says_it_refuses_a_pre_vote() -> None:
    """The leader down, one follower's disk lost (it cannot learn the term: one seed of
    two answers), the other follower's pre-vote asks it: refused, and said as a refused
    vote is -- before, nothing was said (a candidate refused its pre-vote never asks the
    vote, whose refusal EmptyStart logs), and the real-process test of a lost disk
    (test_cluster_lost_disk.py), waiting for the candidate's terms to rise, hung."""
    world = RaftWorld(3, seed=2)
    try:
        leader = elect(world)
        term = terms(world)
        empty, candidate = (a for a in world.addresses if a != leader)
        world.crash(leader)
        world.lose_disk(empty)
        for _ in range(40):
            world.step(0.05)
        assert world.leader() is None and world.nodes[empty]._term_quorum.waiting
        assert world.nodes[candidate].raftCurrentTerm == term  # it never stood
        (line,) = [r.getMessage() for r in world.logs.records
                   if "has not heard the current term" in r.getMessage()]
        assert f"does not vote for {candidate} (term {term + 1})" in line
    finally:
        world.close()
