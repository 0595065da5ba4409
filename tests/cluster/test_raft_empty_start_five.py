"""Attacks on the empty-start rule (cluster/raft_votes.py, cluster/raft_term_query.py)
with five seeds and with log compaction: real pysyncobj nodes on the simulated network
of :mod:`raft_sim`."""

from __future__ import annotations

import pytest
from raft_sim import RaftWorld


def elect(world: RaftWorld, rounds: int = 200) -> str:
    for _ in range(rounds):
        world.step(0.05)
        leader = world.leader()
        if leader is not None:
            return leader
    raise AssertionError("no leader")


def five_commit_without_two(
    seed: int, compaction: bool = False
) -> tuple[RaftWorld, str, str, str, list[str]]:
    """Five seeds elect L; two of them (P, Q) go down; L commits e1, e2 with X and Y
    (3 of 5). Returns (world, L, X, Y, [P, Q]). ``compaction``: every seed compacts
    its log past 2 entries (the leader then sends its dump)."""
    world = (RaftWorld(5, seed=seed, compaction_entries=2, send_seconds=0.001) if compaction
             else RaftWorld(5, seed=seed))
    leader = elect(world)
    x, y, *down = [a for a in world.addresses if a != leader]
    for address in down:
        world.crash(address)
    for value in (b"e1", b"e2"):
        world.submit(leader, value)
    for _ in range(5):
        world.step(0.05)
    assert set(world.acknowledged) == {b"e1", b"e2"}
    return world, leader, x, y, down


def settle(world: RaftWorld, rounds: int = 100) -> None:
    """Every fault healed, every seed up: a leader within ``rounds`` steps, then every
    acknowledged command applied everywhere and a new one acknowledged."""
    world.heal_all()
    for _ in range(rounds):
        world.step(0.05)
        if world.leader() is not None and world.converged():
            break
    assert world.violations() == []
    assert world.leader() is not None and world.converged()
    world.submit(world.leader(), b"after")
    for _ in range(10):
        world.step(0.05)
    assert b"after" in world.acknowledged and world.violations() == []
    assert world.converged()
    assert all(not node._empty_start.active for node in world.nodes.values())


@pytest.mark.parametrize("compaction", [False, True], ids=["log", "compaction"])
@pytest.mark.parametrize("seed", [0, 1, 2])
@pytest.mark.parametrize("holder", ["late", "cut_off", "down"])
def test_two_seeds_of_five_lose_their_disks_at_once_and_nothing_is_lost(
    seed: int, holder: str, compaction: bool
) -> None:
    """L and X lose their disks at once; P, Q (empty logs: down while e1, e2 were
    committed) come back. Y, the one seed left holding e1, e2, is up with every link
    (``late``: its answer to the term query comes after the others'), cut off from L
    and X, or down. Before: L heard P, Q and X -- three of four, none with a log,
    X's empty log being its lost disk's -- took that for a brand-new cluster, voted as
    Raft says, and P or Q led without e1, e2 (two disks lost of five seeds: within
    what five seeds tolerate). Now an empty-started seed's answer is not a witness:
    L and X wait for Y, and Y's log is the floor."""
    world, leader, x, y, down = five_commit_without_two(seed, compaction)
    try:
        if holder == "down":
            world.crash(y)
        elif holder == "cut_off":
            world.cut(y, leader)
            world.cut(y, x)
        world.lose_disk(leader)
        world.lose_disk(x)
        for address in down:
            world.restart(address)
        if holder == "late":  # the empty seeds hear the three others first
            for empty in (leader, x):
                world.tick(empty)
                for other in [*down, leader, x]:
                    if other != empty:
                        world.deliver(empty, other, 99)
                        world.deliver(other, empty, 99)
        for _ in range(60):
            world.step(0.05)
        assert world.violations() == []
        assert world.leader() in (None, y), "a leader without e1, e2"
        settle(world)
    finally:
        world.close()


@pytest.mark.parametrize("seed", [0, 1])
def test_two_seeds_of_five_lose_their_disks_one_after_the_other(seed: int) -> None:
    """L loses its disk and catches up; then X does: everything is kept, and the
    cluster keeps electing (with P and Q down during the commits and back after)."""
    world, leader, x, _, down = five_commit_without_two(seed)
    try:
        for address in down:
            world.restart(address)
        world.lose_disk(leader)
        for _ in range(40):
            world.step(0.05)
        assert not world.nodes[leader]._empty_start.active, "caught up"
        world.submit(world.leader(), b"e3")
        for _ in range(5):
            world.step(0.05)
        world.lose_disk(x)
        for _ in range(40):
            world.step(0.05)
        assert world.violations() == [] and b"e3" in world.acknowledged
        settle(world)
    finally:
        world.close()


def test_five_new_seeds_elect_once_all_five_are_up() -> None:
    """Four new seeds cannot tell a new cluster from two lost disks whose third holder
    is slow to answer (above): they wait for the fifth, then elect."""
    world = RaftWorld(5, seed=3)
    try:
        fifth = world.addresses[4]
        world.crash(fifth)
        for _ in range(40):
            world.step(0.05)
        assert world.leader() is None
        assert all(node._term_quorum.waiting for node in world.nodes.values())
        settle(world)
    finally:
        world.close()


@pytest.mark.parametrize("size", [3, 5])
def test_new_seeds_starting_one_by_one_with_one_crashing_during_bootstrap(size: int) -> None:
    """Seeds start at different times; one is SIGKILLed while the others answer (its
    journal and marker stay) and restarts: a leader, no loss."""
    world = RaftWorld(size, seed=5)
    try:
        late = world.addresses[1:]
        for address in late:
            world.crash(address)
        for address in late:
            world.restart(address)
            for _ in range(3):
                world.step(0.02)
        world.crash(world.addresses[0])
        for _ in range(10):
            world.step(0.05)
        settle(world)
    finally:
        world.close()


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_three_new_seeds_whose_first_leader_is_deposed_elect_again(seed: int) -> None:
    world = RaftWorld(3, seed=seed)
    try:
        a = elect(world)
        b, c = [address for address in world.addresses if address != a]
        world.cut(a, c)
        world.submit(a, b"x")
        world.tick(a)
        assert world.deliver(a, b, 1) == 1
        world.cut(a, b)
        for _ in range(60):
            world.step(0.05)
        settle(world)
    finally:
        world.close()


def test_the_empty_seed_restarted_again_and_again_before_it_caught_up() -> None:
    """Three seeds: B loses its disk while A, which holds e1, e2 with B, is down; B is
    SIGKILLed and restarted (marker kept) five times meanwhile, then A comes back."""
    world = RaftWorld(3, seed=1)
    try:
        a = elect(world)
        b, c = [address for address in world.addresses if address != a]
        world.cut(a, c)
        for value in (b"e1", b"e2"):
            world.submit(a, value)
        for _ in range(5):
            world.step(0.05)
        assert set(world.acknowledged) == {b"e1", b"e2"}
        world.crash(a)
        world.heal(a, c)
        world.lose_disk(b)
        for _ in range(5):
            for _ in range(7):
                world.step(0.05)
            world.crash(b)
            world.restart(b)
            assert world.nodes[b]._empty_start.active
        for _ in range(20):
            world.step(0.05)
        assert world.leader() is None and world.violations() == []
        settle(world)
    finally:
        world.close()


def test_an_answer_without_the_log_index_keeps_the_cluster_live() -> None:
    """An older seed answers the term query without last_log_index (and without
    empty_start): its log counts as the longest of its term. With every seed up the
    cluster still elects and the empty seed catches up."""
    world = RaftWorld(3, seed=2)
    try:
        a = elect(world)
        world.submit(a, b"e1")
        for _ in range(5):
            world.step(0.05)
        old = next(address for address in world.addresses if address != a)
        send = world.send

        def older(source: str, target: str, message: dict) -> bool:
            if source == old and message.get("type") == "migratory_term":
                message = {k: v for k, v in message.items()
                           if k not in ("last_log_index", "empty_start")}
            return send(source, target, message)

        world.send = older  # type: ignore[method-assign]
        empty = next(address for address in world.addresses if address not in (a, old))
        world.lose_disk(empty)
        settle(world)
    finally:
        world.close()


@pytest.mark.parametrize("seed", [0, 1])
def test_a_floor_from_a_tail_later_overwritten_keeps_the_cluster_live(seed: int) -> None:
    """A leads and appends f1..f3 that only A holds; A is cut off, B and C elect C,
    which overwrites nothing yet; B loses its disk and hears A (the longest log: the
    tail) and C. C leads on, A's tail is overwritten once healed; every seed up: a
    leader, everything acknowledged applied everywhere."""
    world = RaftWorld(3, seed=seed)
    try:
        a = elect(world)
        b, c = [address for address in world.addresses if address != a]
        world.submit(a, b"e1")
        for _ in range(5):
            world.step(0.05)
        world.cut(a, b)
        world.cut(a, c)
        for value in (b"f1", b"f2", b"f3"):
            world.submit(a, value)
        world.tick(a)
        for _ in range(60):
            world.step(0.05)
        assert world.leader() in (b, c)
        world.heal(a, b)
        world.lose_disk(b)
        for _ in range(40):
            world.step(0.05)
        assert world.violations() == []
        settle(world)
    finally:
        world.close()


@pytest.mark.parametrize("seed", [0, 1])
def test_an_empty_seed_catches_up_from_a_dump(seed: int) -> None:
    """Log compaction: the leader's log starts after its dump when B loses its disk,
    so B gets the dump, then the entries: it catches up, votes again, nothing lost
    (five seeds with compaction: the two-disks test above)."""
    world = RaftWorld(3, seed=seed, compaction_entries=4, send_seconds=0.001)
    try:
        leader = elect(world)
        for i in range(12):
            world.submit(leader, b"c%d" % i)
            world.step(0.05)
        b = next(address for address in world.addresses if address != leader)
        world.lose_disk(b)
        for _ in range(40):
            world.step(0.05)
        assert world.dumps_installed >= 1
        assert not world.nodes[b]._empty_start.active
        settle(world)
    finally:
        world.close()
