"""A leader drops a follower's answer from an earlier term (cluster/raft_answer_terms.py):
the Raft paper's Figure 8 (§5.4.2), with the answer held across two elections.

On the Raft simulation (raft_sim.py), 5 nodes. A leads and commits entry c everywhere.
A is cut off from C, D and E; its link to B stalls from B to A (a link that delivers late,
or B's answers waiting for its disk). A appends three commands at c+1..c+3; B takes them
and answers "I hold up to c+3" into the stalled link. M (one of C, D, E) is elected and
its no-op at c+1 goes to every node but A, cut off; once linked to M, A too: A's and B's
entries from A's old term are gone. M dies; A is elected again (with the two left of C, D,
E; B's vote waits behind its old answer), its no-op at c+2 reaches them. Then one of them
(Q) is cut off from A, A appends a command at c+3 that P alone takes, and B's old answer
arrives: pysyncobj's leader took "B holds up to c+3" (matchIndex 0 -> c+3) and counted
c+3 committed on A, P and "B" -- an entry on 2 of 5 nodes. A and P die; B, Q and M elect
a leader without it, which commits another entry at c+3.
"""

from __future__ import annotations

from typing import Any

from raft_sim import RaftWorld

from cluster.raft_follower import FollowerSafeSyncObj

Link = tuple[str, str]


def rounds(world: RaftWorld, count: int, held: frozenset[Link] | set[Link] = frozenset()) -> None:
    """``count`` times: 50 ms pass, every live node ticks, every message in flight
    arrives, except on the ``held`` links (which keep theirs, in order)."""
    for _ in range(count):
        world.clock.now += 0.05
        world.tick_all()
        while sum(world.deliver(*link, 10**9) for link in list(world.queues)
                  if link not in held):
            pass


def last_index(world: RaftWorld, address: str) -> int:
    return int(world.nodes[address]._SyncObj__raftLog[-1][1])


def peer(world: RaftWorld, of: str, address: str) -> Any:
    return world.nodes[of]._SyncObj__transport.peers[address]


def hold_elections(world: RaftWorld, *addresses: str) -> None:
    for address in addresses:
        world.nodes[address]._SyncObj__raftElectionDeadline = world.clock.now + 100


def elect(world: RaftWorld, wanted: set[str], held: set[Link], others: list[str]) -> str:
    """Rounds until one of ``wanted`` leads (the ``others`` stand not meanwhile)."""
    for _ in range(80):
        hold_elections(world, *others)
        rounds(world, 1, held)
        leader = world.leader()
        if leader in wanted and all(
                world.nodes[leader].raftCurrentTerm >= n.raftCurrentTerm
                for n in world.nodes.values()):
            return leader
    raise AssertionError(f"none of {wanted} elected")


def without_terms(world: RaftWorld) -> None:
    """Every answer leaves without its term, as from a member of an earlier version."""
    send = world.send

    def old_send(source: str, target: str, message: Any) -> bool:
        if message.get("type") == "next_node_idx":
            message = {k: v for k, v in message.items() if k != "term"}
        return send(source, target, message)

    world.send = old_send  # type: ignore[method-assign]


def figure_8(*, old_followers: bool = False) -> tuple[RaftWorld, dict[str, Any]]:
    """The schedule above; the world (to close) and what was seen on the way."""
    world = RaftWorld(5, seed=3, node_class=FollowerSafeSyncObj)
    if old_followers:
        without_terms(world)
    seen: dict[str, Any] = {}
    try:
        a = elect(world, set(world.addresses), set(), [])
        b, c, d, e = (x for x in world.addresses if x != a)
        world.submit(a, b"before")
        rounds(world, 6)
        committed = last_index(world, a)
        assert all(world.nodes[x].raftCommitIndex == committed for x in world.addresses)
        for x in (c, d, e):
            world.cut(a, x)
        stalled = {(b, a)}
        for value in (b"x1", b"x2", b"x3"):
            world.submit(a, value)
        rounds(world, 2, stalled)
        assert last_index(world, b) == committed + 3  # B took A's three (and answered)
        m = elect(world, {c, d, e}, stalled, [a, b])
        for x in (c, d, e):
            world.heal(a, x)
        rounds(world, 4, stalled)
        assert last_index(world, a) == last_index(world, b) == committed + 1  # M's no-op
        world.crash(m)
        p, q = (x for x in (c, d, e) if x != m)
        assert elect(world, {a}, stalled | {(a, b)}, [b, p, q]) == a
        rounds(world, 3, stalled | {(a, b)})
        assert last_index(world, a) == last_index(world, p) == committed + 2  # A's no-op
        world.cut(a, q)
        world.submit(a, b"z")
        rounds(world, 1, stalled | {(a, b), (p, a)})  # P took z; its answer on its way
        leader = world.nodes[a]
        world.deliver(b, a, 10**9)  # B's answers from A's earlier term (and its votes)
        seen["match"] = leader._SyncObj__raftMatchIndex[peer(world, a, b)]
        seen["b_holds"] = last_index(world, b)
        seen["heard"] = leader._owed(peer(world, a, b))[1]  # (cluster/raft_stale_answers.py)
        rounds(world, 2, stalled | {(a, b)})
        seen["a_commit"], seen["z"] = leader.raftCommitIndex, committed + 3
        world.crash(a)
        world.crash(p)
        world.restart(m)
        rounds(world, 30)
        world.restart(a)
        world.restart(p)
        rounds(world, 30)
        return world, seen
    except BaseException:
        world.close()
        raise


def test_an_answer_from_an_earlier_term_raises_no_match_index() -> None:
    """On the code before: 'A took B for holding up to 6: B holds up to 4', and with that
    assertion taken out, A's commit 6 ('A committed an entry only A and P hold') and the
    new leader's 'sent entry 6 of term 4 over the entry of term 3 committed there'."""
    world, seen = figure_8()
    try:
        assert seen["match"] <= seen["b_holds"], (
            f"A took B for holding up to {seen['match']}: B holds up to {seen['b_holds']}")
        assert seen["a_commit"] < seen["z"], "A committed an entry only A and P hold"
        assert seen["heard"] == 0  # answers none of this leadership's AppendEntries
        assert world.violations()[:2] == []
        assert world.converged()
    finally:
        world.close()


def test_an_answer_without_a_term_is_taken_as_before() -> None:
    """From a member of an earlier version (no term in its answers), pysyncobj's rule
    as before: the schedule's wrong commit is there (what this version's answers fix)."""
    world, seen = figure_8(old_followers=True)
    try:
        assert seen["match"] == seen["z"] > seen["b_holds"]
        assert seen["a_commit"] == seen["z"] and seen["heard"] > 0
        assert any("committed there" in line for line in world.violations())
    finally:
        world.close()
