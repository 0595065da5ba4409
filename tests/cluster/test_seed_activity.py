"""A seed's activity for the idle collector (migratory/server/gc_pauses.py): the
publishes non-seeds forward to it count, as its own clients' do, while their commits
are late."""

from __future__ import annotations

import functools
import gc
from collections.abc import Iterator
from pathlib import Path

import pytest
import trio
import trio.testing
from test_commit_window import FakeRaft, node_at, raft_built

from cluster.coordination import PublishRequest
from migratory.model.message import Message
from migratory.server import gc_pauses


@pytest.fixture
def no_automatic_collections() -> Iterator[None]:
    gc.disable()
    try:
        yield
    finally:
        gc.enable()


@pytest.mark.usefixtures("no_automatic_collections")
def test_a_seed_taking_forwarded_publishes_whose_commits_are_late_is_not_idle(
    tmp_path: Path,
) -> None:
    """A seed whose publishes come from non-seeds (forwarded) holds them in its Raft
    commands until they commit; an overloaded cluster commits late, the hub applies
    nothing for seconds, and an "idle" full collection would walk them all. Taking them
    is activity. (On the code before: 1 idle collection here.)"""
    gc.collect(1)  # a full collection is pending
    node = node_at(tmp_path)
    seed = node.seed
    assert seed is not None
    raft = FakeRaft()
    seed._build_raft = lambda: raft  # type: ignore[assignment,return-value]
    hub_activity = node.server.ctx.hub.activity
    stats = gc_pauses.GcPauseStatistics()

    async def main() -> None:
        async with trio.open_nursery() as nursery:
            await nursery.start(seed.run)
            await raft_built(seed)
            nursery.start_soon(functools.partial(
                gc_pauses.collect_when_idle, node.server.activity, stats
            ))
            for n in range(35):  # 3.5 s, a forward every 0.1 s, none committed
                request = PublishRequest("127.0.0.1:9#n", n + 1, Message("/a/b", b"x"))
                seed.take_forward("127.0.0.1:9", [request])
                await trio.sleep(0.1)
            nursery.cancel_scope.cancel()

    trio.run(main, clock=trio.testing.MockClock(autojump_threshold=0))
    assert len(raft.commands) == 35  # each submitted, none committed
    assert node.server.ctx.hub.activity == hub_activity
    assert node.server.ctx.stats.publishes_received == 0  # no client of its own
    assert stats.idle_collections == 0
