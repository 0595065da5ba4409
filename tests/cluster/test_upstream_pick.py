"""Which seed a non-seed dials (cluster/upstream.py ``pick``): one that answered the
agreement probe first. Before, the seeds were dialled in a shuffled turn whatever the
probe knew: in a whole restart with one seed stalled (it took the dial, said nothing),
a non-seed that drew it waited for the handshake's limit and the TLS question after it
(benchmarks/cluster_whole_restart.py --order stalled: non-seeds ready 8.4 s after the
start where the seeds were at 3.1 s)."""

from __future__ import annotations

import pytest
import trio
import trio.testing

from cluster import link
from cluster.coordination import UNNUMBERED_EPOCH
from cluster.forwarding import Outgoing
from cluster.publishing import ClusterPublishing
from cluster.replica import Replica
from cluster.stream import CommittedStream
from cluster.upstream import UpstreamReplication, pick
from migratory.server.hub import Hub

A, B, C = ("10.0.0.1", 1), ("10.0.0.2", 1), ("10.0.0.3", 1)


def test_the_next_seed_in_turn_that_answered_else_the_next_in_turn() -> None:
    seeds = [A, B, C]
    assert pick(seeds, 0, {"10.0.0.3:1"}) == 2
    assert pick(seeds, 3, {"10.0.0.2:1", "10.0.0.3:1"}) == 1  # (turns wrap)
    assert pick(seeds, 2, {"10.0.0.2:1", "10.0.0.3:1"}) == 2  # in turn among them
    assert [pick(seeds, t, set()) for t in range(4)] == [0, 1, 2, 0]  # none: every seed


def test_a_non_seed_dials_only_the_seeds_that_answered_while_one_has() -> None:
    publishing = ClusterPublishing(origin="edge#1", replica=Replica(Hub(epoch=UNNUMBERED_EPOCH)))
    answered = {"10.0.0.2:1"}
    upstream = UpstreamReplication(
        name="10.0.0.9:1", seeds=[A, B, C], password="p", stream=CommittedStream(publishing),
        outgoing=Outgoing(publishing), max_frame=link.MAX_FRAME, answered=lambda: answered)
    dialled: list[tuple[str, int]] = []
    scope = trio.CancelScope()

    async def follow(address: tuple[str, int]) -> None:
        dialled.append(address)
        if len(dialled) == 4:
            answered.clear()  # the probe lost it too: every seed in turn again
        if len(dialled) == 10:
            scope.cancel()
        await trio.sleep(0)

    upstream._follow = follow  # type: ignore[method-assign]

    async def main() -> None:
        with scope:
            await upstream.run()

    trio.run(main, clock=trio.testing.MockClock(autojump_threshold=0))
    assert dialled[:4] == [B] * 4  # before: A, B and C in a shuffled turn
    assert set(dialled[4:10]) == {A, B, C}


def test_a_non_seed_up_before_the_seeds_waits_a_little_for_one_to_answer(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Before: its first round had found no seed, so it dialled the first in turn -- in
    benchmarks/cluster_whole_restart.py --order stalled, the stopped seed, which held it
    12 s (the handshake, the TLS question): one non-seed ready at 14.2 s, the other 2.8 s."""
    monkeypatch.setattr("random.shuffle", lambda seeds: None)  # A first in turn
    publishing = ClusterPublishing(origin="edge#1", replica=Replica(Hub(epoch=UNNUMBERED_EPOCH)))
    answered: set[str] = set()
    upstream = UpstreamReplication(
        name="10.0.0.9:1", seeds=[A, B, C], password="p", stream=CommittedStream(publishing),
        outgoing=Outgoing(publishing), max_frame=link.MAX_FRAME, answered=lambda: answered)
    dialled: list[tuple[str, int]] = []
    scope = trio.CancelScope()

    async def follow(address: tuple[str, int]) -> None:
        dialled.append(address)
        scope.cancel()
        await trio.sleep(0)

    upstream._follow = follow  # type: ignore[method-assign]

    async def main() -> None:
        async def answer_later() -> None:
            await trio.sleep(0.35)  # the probe's retry heard B
            answered.add("10.0.0.2:1")

        async with trio.open_nursery() as nursery:
            nursery.start_soon(answer_later)
            with scope:
                await upstream.run()

    trio.run(main, clock=trio.testing.MockClock(autojump_threshold=0))
    assert dialled == [B]  # before: [A]
