"""An empty-started seed learns the current term before it takes part
(cluster/raft_term_query.py): the rule alone, then real pysyncobj nodes (raft_sim)."""

from __future__ import annotations

import logging
from typing import Any

import pytest
from raft_sim import RaftWorld

from cluster.raft_term_query import QUERY_SECONDS, TermQuorum


def answer(term: int, last_log_term: int) -> dict[str, int]:
    return {"type": 0, "term": term, "last_log_term": last_log_term}  # type: ignore[dict-item]


def test_a_seed_with_its_disk_does_not_wait() -> None:
    assert not TermQuorum(others=2, waiting=False).waiting
    assert not TermQuorum(others=0, waiting=True).waiting  # a single seed: no one to ask


def test_three_seeds_need_both_others_once_any_holds_a_log() -> None:
    quorum = TermQuorum(others=2, waiting=True)
    assert quorum.hear("A", answer(1, 1)) is None  # a deposed leader alone settles nothing
    assert quorum.waiting
    assert quorum.hear("C", answer(2, 2)) == 2
    assert not quorum.waiting


def test_a_majority_of_seeds_that_lost_their_logs_is_said_not_passed_over(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Three seeds, two started empty (a power cut took two disks), the third with a log
    that may lack what the two had acknowledged together: the query settles on every
    answer (the cluster goes on, from the log left) and says, CRITICAL, that acknowledged
    publications may be lost -- it said only that it continues from the third's term, as
    after one lost disk, which loses nothing."""
    empty = {"term": 3, "last_log_term": 0, "last_log_index": 0, "empty_start": True}
    caplog.set_level(logging.INFO, logger="migratory.raft")
    two_lost = TermQuorum(others=2, waiting=True)
    assert two_lost.hear("B", empty) is None
    assert two_lost.hear("C", {"term": 3, "last_log_term": 2, "last_log_index": 40}) == 3
    assert two_lost.majority_lost and not two_lost.new_cluster
    (critical,) = [r for r in caplog.records if r.levelno == logging.CRITICAL]
    assert "only 1 of the 3 seeds kept their Raft log" in critical.getMessage()
    assert "may be lost" in critical.getMessage()
    caplog.clear()
    one_lost = TermQuorum(others=2, waiting=True)  # what 3 seeds tolerate: nothing said
    one_lost.hear("B", {"term": 3, "last_log_term": 2, "last_log_index": 40})
    assert one_lost.hear("C", {"term": 3, "last_log_term": 2, "last_log_index": 39}) == 3
    assert not one_lost.majority_lost
    new = TermQuorum(others=2, waiting=True)  # a brand-new cluster: every seed empty
    new.hear("B", empty)
    assert new.hear("C", {**empty, "last_log_term": 0}) == 3
    assert new.new_cluster and not new.majority_lost
    assert not [r for r in caplog.records if r.levelno >= logging.ERROR]
    five = TermQuorum(others=4, waiting=True)  # 5 seeds: three lost, two kept theirs
    for seed in ("P", "Q"):
        five.hear(seed, empty)
    five.hear("R", answer(4, 2))
    assert five.hear("S", answer(4, 2)) == 4 and five.majority_lost


def test_a_new_cluster_needs_the_answers_of_as_many_others_as_any_other_start() -> None:
    """Answers from ``ceil(n/2)`` others, none with an entry of a leader: a new cluster.
    Fewer never settle it (they did until 2026-11-28: one empty answer of three, two
    of five -- but a seed down while the others committed answers just the same)."""
    three = TermQuorum(others=2, waiting=True)
    assert three.hear("A", answer(0, 0)) is None
    assert three.waiting and not three.new_cluster
    assert three.hear("C", answer(2, 0)) == 2
    assert three.new_cluster and three.log_floor[0] == 0
    five = TermQuorum(others=4, waiting=True)
    assert five.hear("A", answer(1, 0)) is None
    assert five.hear("B", answer(0, 0)) is None
    assert five.hear("C", answer(0, 0)) == 1
    assert five.new_cluster
    five_with_history = TermQuorum(others=4, waiting=True)
    five_with_history.hear("A", answer(3, 0))
    assert five_with_history.hear("B", answer(3, 2)) is None
    assert five_with_history.hear("C", answer(4, 3)) == 4
    assert not five_with_history.new_cluster  # a seed that lost its disk catches up


def test_the_log_floor_is_the_most_up_to_date_log_told() -> None:
    quorum = TermQuorum(others=2, waiting=True)
    quorum.hear("A", {"term": 5, "last_log_term": 4, "last_log_index": 30})
    assert quorum.hear("C", {"term": 5, "last_log_term": 5, "last_log_index": 12}) == 5
    assert quorum.log_floor == (5, 12)
    older = TermQuorum(others=2, waiting=True)  # an answer without the index (older seed)
    older.hear("A", answer(5, 4))
    older.hear("C", {"term": 5, "last_log_term": 4, "last_log_index": 30})
    assert older.log_floor[0] == 4 and older.log_floor[1] > 10**9


def test_queries_go_to_the_seeds_not_heard_at_most_every_period() -> None:
    quorum = TermQuorum(others=2, waiting=True)
    assert quorum.due(10.0, ["A", "C"]) == ["A", "C"]
    assert quorum.due(10.0 + QUERY_SECONDS / 2, ["A", "C"]) == []
    quorum.hear("A", answer(1, 1))
    assert quorum.due(10.0 + QUERY_SECONDS, ["A", "C"]) == ["C"]
    assert quorum.hear("C", {"term": "x"}) is None  # a malformed answer counts for nothing


def test_two_of_three_new_seeds_wait_for_the_third_then_elect() -> None:
    """A new cluster's first election needs every seed of three (they cannot tell a
    new cluster from one whose third seed holds what they lost); then two are enough."""
    world = RaftWorld(3, seed=4)
    try:
        missing = world.addresses[2]
        world.crash(missing)  # not started yet, as far as the others can tell
        for _ in range(40):
            world.step(0.05)
        assert world.leader() is None
        assert all(node._term_quorum.waiting for node in world.nodes.values())
        world.restart(missing)
        for _ in range(40):
            world.step(0.05)
        assert world.leader() is not None
        world.crash(next(a for a in world.addresses if a != world.leader()))
        world.submit(world.leader(), b"x")
        for _ in range(5):
            world.step(0.05)
        assert b"x" in world.acknowledged and world.violations() == []
    finally:
        world.close()


def test_an_empty_started_seeds_answer_is_no_witness_until_every_seed_answered() -> None:
    """Five seeds: three answers settle it only if none comes from a seed that is
    empty-started itself (its empty log is its lost disk's); such a seed is asked
    again, and the answers of all four settle it anyway (a brand-new cluster)."""
    empty = {"term": 1, "last_log_term": 0, "last_log_index": 0, "empty_start": True}
    lagging = {"term": 2, "last_log_term": 1, "last_log_index": 1}
    quorum = TermQuorum(others=4, waiting=True)
    assert quorum.hear("P", lagging) is None
    assert quorum.hear("Q", lagging) is None
    assert quorum.hear("X", empty) is None  # before: settled on a floor without Y's log
    assert quorum.waiting
    assert quorum.due(1.0, ["P", "Q", "X", "Y"]) == ["X", "Y"]
    assert quorum.hear("Y", {"term": 2, "last_log_term": 1, "last_log_index": 3}) == 2
    assert quorum.log_floor == (1, 3) and not quorum.new_cluster
    caught_up = TermQuorum(others=4, waiting=True)
    for seed in ("P", "Q"):
        caught_up.hear(seed, answer(2, 1))
    assert caught_up.hear("X", {**empty, "empty_start": False}) == 2  # X caught up since
    new = TermQuorum(others=4, waiting=True)
    for seed in ("A", "B", "C"):
        assert new.hear(seed, empty) is None
    assert new.hear("D", empty) == 1 and new.new_cluster


def asked(round_: int, term: int, last: tuple[int, int], *, empty: bool) -> dict[str, Any]:
    return {"term": term, "last_log_term": last[0], "last_log_index": last[1],
            "empty_start": empty, "ask": round_}


def test_an_empty_answer_asked_before_a_leaders_entry_came_is_asked_again(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A brand-new cluster's late seed heard A empty-started (round 1: linked to A only);
    A and B then settled, elected B, and B's entry came in round 2 before A's new answer:
    "every other seed answered, only B kept its log" -- CRITICAL, a majority lost, on a
    first start. An empty answer counts only if asked after the last answer with a
    leader's entry came; a majority that did lose its logs is still said, a round later."""
    caplog.set_level(logging.INFO, logger="migratory.raft")
    late = TermQuorum(others=2, waiting=True)
    assert late.due(10.0, ["A"]) == ["A"] and late.query()["ask"] == 1
    assert late.hear("A", asked(1, 0, (0, 1), empty=True)) is None
    assert late.due(11.0, ["A", "B"]) == ["A", "B"]
    assert late.hear("B", asked(2, 1, (1, 2), empty=False)) is None, "A's answer is stale"
    assert late.waiting and not late.majority_lost
    assert late.hear("A", asked(2, 1, (1, 2), empty=False)) == 1  # A settled a new cluster
    assert not late.majority_lost and not late.new_cluster and late.log_floor == (1, 2)
    assert not [r for r in caplog.records if r.levelno >= logging.ERROR]
    lost = TermQuorum(others=2, waiting=True)  # the same answers, A's disk really lost
    lost.due(10.0, ["A"])
    lost.hear("A", asked(1, 3, (0, 1), empty=True))
    lost.due(11.0, ["A", "B"])
    assert lost.hear("B", asked(2, 3, (2, 40), empty=False)) is None
    assert lost.hear("A", asked(2, 3, (0, 1), empty=True)) is None, "asked before B's came"
    assert lost.due(12.0, ["A", "B"]) == ["A"]
    assert lost.hear("A", asked(3, 3, (0, 1), empty=True)) == 3 and lost.majority_lost
    (critical,) = [r for r in caplog.records if r.levelno == logging.CRITICAL]
    assert "only 1 of the 3 seeds kept their Raft log" in critical.getMessage()


def test_a_new_clusters_late_seed_does_not_take_a_stale_answer_for_a_lost_log() -> None:
    """Real nodes: the third seed of a new cluster is linked to the first a round before
    the second (its link to it comes up later); the two settle on its answers and elect;
    its next round brings the follower's new answer after the leader's -- before, it
    logged CRITICAL "only 1 of the 3 seeds kept their Raft log" (nothing was lost)."""
    world = RaftWorld(3, seed=0)
    try:
        first, second, late = world.addresses
        world.crash(late)  # not started yet
        world.cut(second, late)  # its link to the second comes up later
        for _ in range(10):
            world.step(0.05)
        world.restart(late)
        world.tick(late)  # asks the first alone
        world.deliver(late, first)
        world.deliver(first, late, 10)  # "empty_start": the first has not heard it yet
        assert world.nodes[late]._term_quorum.heard  # (the stale answer)
        world.clock.now += QUERY_SECONDS
        world.tick(first)
        world.deliver(first, late, 10)
        world.deliver(late, first, 10)  # the first hears the late seed: a new cluster
        world.heal(second, late)
        world.clock.now += QUERY_SECONDS
        world.tick(second)
        world.deliver(second, late, 10)
        world.deliver(late, second, 10)  # the second too
        for _ in range(20):  # the two elect while the late seed does not tick
            world.clock.now += 0.05
            world.tick(first)
            world.tick(second)
            world.deliver(first, second, 100)
            world.deliver(second, first, 100)
        leader = world.leader()
        assert leader is not None
        follower = first if leader == second else second
        world.clock.now += QUERY_SECONDS
        world.tick(late)  # asks both again
        world.deliver(late, first, 10)
        world.deliver(late, second, 10)
        world.deliver(follower if leader == first else leader, late, 10)  # the stale one's
        world.deliver_all()  # peer with a leader's entry first, then the other
        for _ in range(20):
            world.step(0.05)
        world.submit(world.leader(), b"x")
        for _ in range(10):
            world.step(0.05)
        assert b"x" in world.acknowledged and world.converged()
        assert not world.nodes[late]._term_quorum.waiting
        assert world.violations() == []  # (a CRITICAL line is one)
    finally:
        world.close()


def test_two_of_three_lost_disks_after_commits_are_still_said() -> None:
    """Real nodes: a cluster with a log; two seeds lose their ClusterDataDir at once
    (beyond what three tolerate): each says CRITICAL that acknowledged publications may
    be lost, and the cluster goes on from the third's log."""
    world = RaftWorld(3, seed=1)
    try:
        for _ in range(40):
            world.step(0.05)
        kept = world.leader()
        assert kept is not None
        for value in (b"a", b"b"):
            world.submit(kept, value)
        for _ in range(5):
            world.step(0.05)
        assert {b"a", b"b"} <= set(world.acknowledged)
        lost = [a for a in world.addresses if a != kept]
        for address in lost:
            world.lose_disk(address)
        for _ in range(60):
            world.step(0.05)
        lines = world.critical_lines()
        assert len(lines) == 2 and all("only 1 of the 3 seeds kept" in line for line in lines)
        assert world.leader() is not None and world.converged()
    finally:
        world.close()
