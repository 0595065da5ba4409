"""A seed that lost its ClusterDataDir does not vote its way into losing what it had
acknowledged (cluster/raft_votes.py): the rule alone, then real pysyncobj nodes on the
simulated network of :mod:`raft_sim`."""

from __future__ import annotations

import logging
import pickle
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from raft_planted import StandsWithAPrefix, VotesWithAnEmptyDisk
from raft_sim import RaftWorld

from cluster.raft_disk import RaftDiskFailure
from cluster.raft_follower import FollowerSafeSyncObj
from cluster.raft_votes import (
    MARKER_SUFFIX,
    TEST_SWITCH,
    VOTES_ON_EMPTY_DISK,
    EmptyStart,
    votes_on_empty_disk,
)


def vote(term: int, last_log_term: int) -> dict[str, Any]:
    return {"type": "request_vote", "term": term, "last_log_index": 5,
            "last_log_term": last_log_term}


def test_a_seed_with_a_journal_votes_as_raft_says(tmp_path: Path) -> None:
    journal = tmp_path / "raft.journal"
    journal.write_bytes(b"held")
    start = EmptyStart(str(journal))
    assert not start.active
    assert start.may_vote(vote(7, 3)) and start.may_vote(vote(1, 0))
    assert not (tmp_path / ("raft.journal" + MARKER_SUFFIX)).exists()


def vote_at(term: int, last_log_term: int, last_log_index: int) -> dict[str, Any]:
    return {**vote(term, last_log_term), "last_log_index": last_log_index}


def test_an_empty_start_votes_only_for_the_longest_log_told_until_it_caught_up(
    tmp_path: Path,
) -> None:
    """Before the term query settles: no vote; after: only for a log at least as
    up-to-date as the longest the others told (``log_floor``) -- not for an empty log,
    which a seed down while the others committed has too (before, any candidate with
    an empty log had its vote)."""
    journal = tmp_path / "raft.journal"
    start = EmptyStart(str(journal))
    marker = Path(str(journal) + MARKER_SUFFIX)
    assert start.active and marker.exists()
    assert not start.may_vote(vote(1, 0)) and not start.may_vote(vote(9, 4))
    assert not start.may_stand(last_log_term=0)
    start.settled((4, 7), new_cluster=False, term=9)
    assert start.active
    assert not start.may_vote(vote_at(10, 0, 1)), "an empty log: maybe down all along"
    assert not start.may_vote(vote_at(10, 4, 6)), "shorter than the longest told"
    assert not start.may_vote(vote_at(10, 3, 50)), "an older last term"
    assert start.may_vote(vote_at(10, 4, 7)) and start.may_vote(vote_at(10, 5, 2))
    assert not start.may_stand(last_log_term=0) and not start.may_stand(last_log_term=4)
    start.caught_up(last_log_term=0, current_term=9)  # nothing of a leader yet
    assert start.active
    journal.write_bytes(b"pysyncobj's journal")
    assert EmptyStart(str(journal)).active, "restarted before catching up: still empty"
    start.caught_up(last_log_term=4, current_term=9)
    assert not start.active and not marker.exists()
    assert not start.may_vote(vote(9, 4)), "it may have voted in term 9 before"
    assert start.may_vote(vote(10, 4)) and start.may_vote(vote(10, 0))
    assert start.may_stand(last_log_term=4)
    assert not EmptyStart(str(journal)).active


def test_an_empty_start_in_a_new_cluster_votes_as_raft_says(tmp_path: Path) -> None:
    start = EmptyStart(str(tmp_path / "raft.journal"))
    start.settled((0, 1), new_cluster=True, term=2)
    assert not start.active
    assert start.may_vote(vote(3, 0)) and start.may_stand(last_log_term=0)


def test_a_new_clusters_first_refusals_are_not_taken_for_a_lost_disk(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Every seed of a brand-new cluster starts empty and refuses votes in the term it
    found: before, each such refusal was a WARNING that it "may have voted in that term
    before it lost its disk" -- on a cluster whose disks were all new."""
    caplog.set_level(logging.INFO, logger="migratory.raft")
    new = EmptyStart(str(tmp_path / "new.journal"))
    new.settled((0, 0), new_cluster=True, term=1)
    assert not new.may_vote(vote(1, 0))
    new.refused("127.0.0.1:2", vote(1, 0))
    lost = EmptyStart(str(tmp_path / "lost.journal"))
    lost.settled((4, 7), new_cluster=False, term=9)
    lost.caught_up(last_log_term=4, current_term=9)
    lost.refused("127.0.0.1:3", vote(9, 4))
    lines = [(r.levelno, r.getMessage()) for r in caplog.records if "no vote for" in r.getMessage()]
    assert [level for level, _ in lines] == [logging.INFO, logging.WARNING]
    assert "brand-new cluster" in lines[0][1] and "lost its disk" not in lines[0][1]
    assert "lost its disk" in lines[1][1]


def test_a_marker_that_cannot_be_written_names_itself(tmp_path: Path) -> None:
    """A full disk at start-up: the member's one line says which file (was a bare
    'No space left on device')."""
    journal = tmp_path / "gone" / "raft.journal"
    with pytest.raises(RaftDiskFailure, match=f"cannot write {journal}{MARKER_SUFFIX}"):
        EmptyStart(str(journal))


def test_the_test_switch_votes_as_pysyncobj_does(tmp_path: Path) -> None:
    """``MIGRATORY_TEST_RAFT=votes-on-empty-disk`` (test_cluster_lost_disk.py plants the
    loss with it in member processes): the rule off; any other value is refused."""
    planted = EmptyStart(str(tmp_path / "raft.journal"), {TEST_SWITCH: VOTES_ON_EMPTY_DISK})
    assert planted.active and planted.may_vote(vote(9, 4)) and planted.may_stand(0)
    assert not EmptyStart(str(tmp_path / "other.journal"), {}).may_vote(vote(9, 4))
    assert not votes_on_empty_disk({TEST_SWITCH: ""})
    with pytest.raises(ValueError, match=TEST_SWITCH):
        votes_on_empty_disk({TEST_SWITCH: "votes-on-empty"})


def lose_the_disk(world: RaftWorld, address: str) -> None:
    world.lose_disk(address)


def seed_loses_its_disk_while_another_is_down(
    node_class: type[Any], lose: Callable[[RaftWorld, str], None] = lose_the_disk
) -> tuple[RaftWorld, str]:
    """Leader A and follower B commit e1, e2 (C is cut off from A). B's disk is lost and
    B restarts empty (or ``lose`` does something else to B); A is down: only B and C are
    up, and C never had e1, e2."""
    world = RaftWorld(3, node_class=node_class, seed=1)
    for _ in range(20):
        world.step(0.05)
    a = world.leader()
    assert a is not None
    b, c = [address for address in world.addresses if address != a]
    world.cut(a, c)
    for value in (b"e1", b"e2"):
        world.submit(a, value)
    world.tick(a)
    world.deliver(a, b, 99)
    world.deliver(b, a, 99)
    world.tick(a)
    assert set(world.acknowledged) == {b"e1", b"e2"}
    world.crash(a)
    lose(world, b)
    for _ in range(60):
        world.step(0.05)
    return world, a


def test_with_a_seed_down_the_empty_seed_waits_instead_of_losing_what_was_acknowledged() -> None:
    world, _ = seed_loses_its_disk_while_another_is_down(FollowerSafeSyncObj)
    try:
        assert world.violations() == []
        assert world.leader() is None, "a leader without e1, e2"
        world.heal_all()  # A comes back: it holds e1, e2
        for _ in range(60):
            world.step(0.05)
        assert world.leader() is not None
        assert world.violations() == []
        assert world.converged(), "every seed has e1, e2 again"
        assert all(not node._empty_start.active for node in world.nodes.values())
    finally:
        world.close()


def test_pysyncobj_alone_loses_the_acknowledged_entries() -> None:
    world, _ = seed_loses_its_disk_while_another_is_down(VotesWithAnEmptyDisk)
    try:
        assert world.leader() is not None
        assert world.violations(), "the planted bug must be seen"
    finally:
        world.close()


@pytest.mark.parametrize("size", [3, 5])
def test_a_brand_new_cluster_of_empty_seeds_elects(size: int) -> None:
    world = RaftWorld(size, seed=2)
    try:
        for _ in range(20):
            world.step(0.05)
        assert world.leader() is not None
        world.submit(world.leader(), b"x")
        for _ in range(5):
            world.step(0.05)
        assert world.acknowledged and world.violations() == []
        assert all(not node._empty_start.active for node in world.nodes.values())
        held_back = [r for r in world.logs.records if "does not stand" in r.getMessage()]
        assert held_back == [], "a follower of a live leader stands for nothing anyway"
    finally:
        world.close()


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_a_new_cluster_whose_first_leader_is_deposed_elects_again(seed: int) -> None:
    """Five new seeds elect A; A's first entry reaches only B, then A is cut off from
    everyone long enough to step down. Healed, A stands with its entry. Before the fix
    the three seeds still empty-started refused A (its log is not empty), refused each
    other (B holds more) and B, holding part of A's log, did not stand: no leader ever
    again -- a new chaos cluster of five sat 60 s without one (seed 2811, a busy box).
    Now the term query's "a new cluster" ends their empty start at once."""
    world = RaftWorld(5, seed=seed)
    try:
        for _ in range(200):
            world.step(0.05)
            if world.leader() is not None:
                break
        a = world.leader()
        assert a is not None
        b, *rest = [address for address in world.addresses if address != a]
        for other in rest:
            world.cut(a, other)
        world.submit(a, b"x")
        world.tick(a)
        assert world.deliver(a, b, 1) == 1
        world.cut(a, b)
        for _ in range(60):  # A alone: it steps down; the others elect no one without it
            world.step(0.05)
        world.heal_all()
        for _ in range(100):
            world.step(0.05)
        assert world.leader() is not None
        assert all(not node._empty_start.active for node in world.nodes.values())
        world.submit(world.leader(), b"y")
        for _ in range(5):
            world.step(0.05)
        assert b"y" in world.acknowledged and world.violations() == []
    finally:
        world.close()


def ask_the_term(world: RaftWorld, empty: str) -> None:
    """The empty-started seed asks the others their term and has their answers
    (cluster/raft_term_query.py), before anything else reaches it."""
    world.tick(empty)
    others = [address for address in world.addresses if address != empty]
    for other in others:
        world.deliver(empty, other, 99)
    for other in others:
        world.deliver(other, empty, 99)
    assert not world.nodes[empty]._term_quorum.waiting


def empty_seed_fed_one_message_at_a_time(world: RaftWorld, rounds: int) -> tuple[str, str, str]:
    """Leader A and follower B commit 20 entries, then e1 (C is cut off from A and lacks
    e1). B loses its disk and restarts; A sends it the log again, from the start, in
    messages of 300 bytes: ``rounds`` of them reach B. Then A dies."""
    for _ in range(20):
        world.step(0.05)
    a = world.leader()
    assert a is not None
    b, c = [address for address in world.addresses if address != a]
    for i in range(20):
        world.submit(a, b"old%02d" % i + b"x" * 40)
    for _ in range(10):
        world.step(0.05)
    world.cut(a, c)
    world.submit(a, b"e1")
    world.tick(a)
    world.deliver(a, b, 99)
    world.deliver(b, a, 99)
    world.tick(a)
    assert b"e1" in world.acknowledged
    lose_the_disk(world, b)
    ask_the_term(world, b)
    for _ in range(rounds):
        world.clock.now += 0.05
        world.tick(a)
        world.deliver(a, b, 1)
        world.tick(b)
        world.deliver(b, a, 99)
    return a, b, c


@pytest.mark.parametrize("rounds", [2, 4, 6])
def test_an_empty_seed_that_holds_a_prefix_of_the_log_does_not_vote(rounds: int) -> None:
    """B holds entries of the leader, but not e1 yet: it must not vote for C (which
    lacks e1) when A dies. Before the fix, B counted as caught up at its first entry of
    a leader's term and C was elected over e1 (entry 23 committed twice)."""
    world = RaftWorld(3, seed=1, batch_bytes=300)
    try:
        a, b, _ = empty_seed_fed_one_message_at_a_time(world, rounds)
        world.crash(a)
        for _ in range(60):
            world.step(0.05)
        assert world.violations()[:1] == []
        assert world.leader() is None, "a leader without e1"
        assert world.nodes[b]._empty_start.active
    finally:
        world.close()


@pytest.mark.parametrize("node_class", [FollowerSafeSyncObj, StandsWithAPrefix],
                         ids=["ours", "planted"])
def test_an_empty_seed_that_holds_a_prefix_of_the_log_does_not_stand(
    node_class: type[Any],
) -> None:
    """B holds every entry C holds, but not e1, when A dies: not voting is not enough.
    B stood for election, C voted for it (B's log is as long as its own), and B led
    without e1 (entry 23 committed twice; found with these world seeds)."""
    world = RaftWorld(3, node_class=node_class, seed=20, batch_bytes=450)
    try:
        a, b, c = empty_seed_fed_one_message_at_a_time(world, 5)
        log_end = [world.nodes[x]._SyncObj__raftLog[-1][1] for x in (b, c)]
        assert world.nodes[b]._empty_start.active and log_end[0] == log_end[1]
        world.crash(a)
        for _ in range(100):
            world.step(0.05)
        if node_class is FollowerSafeSyncObj:
            assert world.leader() is None and world.violations() == []
        else:
            assert world.leader() == b and world.violations(), "the planted bug must be seen"
    finally:
        world.close()


def test_an_empty_seed_that_received_the_whole_log_votes_again() -> None:
    """Liveness: once B holds the leader's log up to its commit index, B votes again, and
    B and C elect a leader (with e1) when A dies."""
    world = RaftWorld(3, seed=1, batch_bytes=300)
    try:
        a, b, _ = empty_seed_fed_one_message_at_a_time(world, 12)
        assert not world.nodes[b]._empty_start.active
        world.crash(a)
        for _ in range(60):
            world.step(0.05)
        assert world.leader() is not None and world.violations() == []
    finally:
        world.close()


def test_an_empty_seed_catches_up_while_commands_keep_coming() -> None:
    """Liveness under load: every heartbeat of the leader carries new entries (never an
    empty AppendEntries); the empty seed still catches up, and votes when A dies."""
    world = RaftWorld(3, seed=3, batch_bytes=300)
    try:
        for _ in range(20):
            world.step(0.05)
        a = world.leader()
        assert a is not None
        b = next(address for address in world.addresses if address != a)
        lose_the_disk(world, b)
        for i in range(40):
            world.submit(a, b"load%03d" % i)
            world.step(0.05)
        assert not world.nodes[b]._empty_start.active
        world.crash(a)
        for _ in range(60):
            world.step(0.05)
        assert world.leader() is not None and world.violations() == []
    finally:
        world.close()


def test_an_empty_seed_does_not_make_a_majority_for_a_deposed_leader() -> None:
    """A leads term 1 and is cut off from B and C; C is elected (term 2), B and C commit
    e. B is cut off from C, loses its disk and restarts (current term 0); the link A-B
    heals while A still believes it leads (within leaderFallbackTimeout). B takes A's
    term-1 AppendEntries and acknowledges them: A commits x1..x3 at the positions of
    C's no-op and e -- two acknowledged messages at one position."""
    world = RaftWorld(3, seed=1)
    try:
        for _ in range(20):
            world.step(0.05)
        a = world.leader()
        assert a is not None
        others = [address for address in world.addresses if address != a]
        for other in others:
            world.cut(a, other)
        for _ in range(80):
            world.step(0.01)
            new = [x for x in others if world.nodes[x]._SyncObj__raftState == 2]
            if new:
                break
        assert new, "B and C elect"
        leader, follower = new[0], next(x for x in others if x != new[0])
        world.submit(leader, b"e")
        for _ in range(5):
            world.step(0.01)
        assert b"e" in world.acknowledged
        world.cut(follower, leader)
        lose_the_disk(world, follower)
        world.heal(a, follower)
        for value in (b"x1", b"x2", b"x3"):
            world.submit(a, value)
        for _ in range(6):
            world.step(0.02)
        assert world.violations()[:1] == []
    finally:
        world.close()


def test_the_vote_floor_survives_a_restart_after_catching_up() -> None:
    """B loses its disk and catches up in term T (no vote in T: it may have voted in T
    before). Then an ordinary crash and restart (journal kept, marker gone): still no
    vote in T. Before the fix the floor lived in memory only and B granted it."""
    world = RaftWorld(3, seed=3, batch_bytes=300)
    try:
        for _ in range(20):
            world.step(0.05)
        a = world.leader()
        assert a is not None
        b, c = [address for address in world.addresses if address != a]
        world.lose_disk(b)
        for i in range(5):
            world.submit(a, b"x%d" % i)
            world.step(0.05)
        assert not world.nodes[b]._empty_start.active
        term = world.nodes[b].raftCurrentTerm
        world.crash(b)
        world.restart(b)
        world.cut(a, b)
        transport = world.nodes[b]._SyncObj__transport
        sent = len(world.queues[(b, c)])
        transport._onMessageReceived(transport.peers[c], {
            "type": "request_vote", "term": term, "last_log_term": 10**6,
            "last_log_index": 10**6,
        })
        answers = [pickle.loads(m)["type"] for m in list(world.queues[(b, c)])[sent:]]
        assert "response_vote" not in answers
    finally:
        world.close()


def a_seed_cut_off_before_the_first_leader(seed: int) -> tuple[RaftWorld, str, str, str]:
    """Three new seeds answer each other's term query; then A is cut off from both
    before a leader is elected, and B and C commit ``e`` without it (A's log stays
    empty). B loses its disk. Returns (world, A, B, C) with C the other holder of e."""
    world = RaftWorld(3, seed=seed)
    a, b, c = world.addresses
    for _ in range(400):
        world.step(0.005)
        if not any(node._term_quorum.waiting for node in world.nodes.values()):
            break
    assert world.leader() is None and world.committed.keys() <= {1}
    world.cut(a, b)
    world.cut(a, c)
    for _ in range(30):
        world.step(0.05)
    leader = world.leader()
    assert leader in (b, c)
    world.submit(leader, b"e")
    for _ in range(5):
        world.step(0.05)
    assert b"e" in world.acknowledged
    assert world.nodes[a]._SyncObj__getCurrentLogTerm() == 0, "A holds nothing of a leader"
    if leader == c:
        b, c = c, b  # B: the one that loses its disk, whichever led
    world.lose_disk(b)
    return world, a, b, c


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_an_empty_seed_does_not_elect_a_seed_that_was_cut_off(seed: int) -> None:
    """One fault only: B lost its disk; A (an empty log: cut off while B and C
    committed) and C are up, A-B healed. B used to take A's empty answer for a new
    cluster (or grant any empty-log candidate its vote) and elect A over e, which
    hypothesis found in CI (test_raft_safety.py: "leader of term 5 holds (5, …) at
    index 2, committed by term 4"). Now B waits for C's answer and votes only for a log
    as up-to-date as C's: C leads, e survives."""
    world, a, b, c = a_seed_cut_off_before_the_first_leader(seed)
    try:
        world.heal(a, b)
        for _ in range(60):
            world.step(0.05)
        assert world.violations() == []
        assert world.leader() in (b, c), "A, without e, may not lead"  # (B once caught up)
        world.heal_all()
        for _ in range(40):
            world.step(0.05)
        assert world.violations() == [] and world.converged()
        assert all(not node._empty_start.active for node in world.nodes.values())
    finally:
        world.close()


def test_an_empty_seed_and_a_seed_cut_off_wait_for_the_third() -> None:
    """Two faults (B lost its disk, C, the other holder of e, is down): A and B elect
    no one (an open finding until 2026-11-28: B voted for A's empty log and A led
    without e); C back, C leads and e is kept."""
    world, a, b, c = a_seed_cut_off_before_the_first_leader(1)
    try:
        world.crash(c)
        world.heal(a, b)
        for _ in range(60):
            world.step(0.05)
        assert world.leader() is None and world.violations() == []
        world.heal_all()
        for _ in range(60):
            world.step(0.05)
        assert world.leader() in (b, c) and world.violations() == [] and world.converged()
    finally:
        world.close()
