"""An empty-started seed learns the current term before it takes part
(cluster/raft_term_query.py): the rule alone, then real pysyncobj nodes (raft_sim)."""

from __future__ import annotations

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


def test_a_new_cluster_forms_without_its_last_seed() -> None:
    three = TermQuorum(others=2, waiting=True)
    assert three.hear("A", answer(0, 0)) == 0
    five = TermQuorum(others=4, waiting=True)
    assert five.hear("A", answer(1, 0)) is None
    assert five.hear("B", answer(0, 0)) == 1
    assert three.new_cluster and five.new_cluster
    five_with_history = TermQuorum(others=4, waiting=True)
    five_with_history.hear("A", answer(3, 0))
    assert five_with_history.hear("B", answer(3, 2)) is None
    assert five_with_history.hear("C", answer(4, 3)) == 4
    assert not five_with_history.new_cluster  # a seed that lost its disk catches up


def test_queries_go_to_the_seeds_not_heard_at_most_every_period() -> None:
    quorum = TermQuorum(others=2, waiting=True)
    assert quorum.due(10.0, ["A", "C"]) == ["A", "C"]
    assert quorum.due(10.0 + QUERY_SECONDS / 2, ["A", "C"]) == []
    quorum.hear("A", answer(1, 1))
    assert quorum.due(10.0 + QUERY_SECONDS, ["A", "C"]) == ["C"]
    assert quorum.hear("C", {"term": "x"}) is None  # a malformed answer counts for nothing


def test_two_of_three_new_seeds_elect_without_the_third() -> None:
    world = RaftWorld(3, seed=4)
    try:
        missing = world.addresses[2]
        world.crash(missing)  # never started, as far as the others can tell
        for _ in range(40):
            world.step(0.05)
        assert world.leader() is not None
        world.submit(world.leader(), b"x")
        for _ in range(5):
            world.step(0.05)
        assert b"x" in world.acknowledged and world.violations() == []
    finally:
        world.close()
