"""The load of the leader-stop tests (test_cluster_leader_drain.py,
test_cluster_follower_during_leader_stop.py, test_cluster_leader_scale_out_drain.py):
an SDK subscriber that records every notification and message it gets, and a publisher
that publishes at a steady rate through one member and reports each acknowledgement.
Each test records what it needs through the callbacks."""

from __future__ import annotations

import random
from collections.abc import Callable
from typing import Any, TypeVar

import trio

from migratory_client import Message, Notification, ReconnectPolicy, connect

FAST = ReconnectPolicy(initial_delay=0.05, max_delay=0.3, connect_timeout=3.0)
T = TypeVar("T")


async def subscribe_recording(
    servers: list[str], subject: str, stop: trio.Event, *,
    on_note: Callable[[Notification], Any], on_message: Callable[[Message], Any],
    seed: int = 1,
) -> None:
    """Subscribe ``subject`` through ``servers`` (weighted, picked with ``seed``'s random
    numbers) until ``stop``; each notification to ``on_note``, each message to
    ``on_message``."""
    async with (
        connect(servers, reconnect=FAST, rng=random.Random(seed)) as client,
        client.subscribe(subject) as subscription,
        trio.open_nursery() as nursery,
    ):
        async def watch() -> None:
            async for note in client.notifications():
                on_note(note)

        nursery.start_soon(watch)
        while not stop.is_set():
            with trio.move_on_after(0.2):
                on_message(await subscription.__anext__())
        nursery.cancel_scope.cancel()


async def publish_steadily(
    url: str, subject: str, until: float, rate: float, *,
    on_ack: Callable[[T, int], Any], mark: Callable[[], T],
) -> None:
    """Publish ``rate`` a second to ``subject`` through ``url`` until ``until`` (trio
    time), each without waiting for the one before; ``mark()`` is taken as each is sent,
    and ``on_ack(mark, seq)`` called for each acknowledged (a definite PUBLISH_FAILED, at
    a leader's change, is not)."""
    async with connect([url], reconnect=FAST) as client:
        async def one(n: int) -> None:
            marked = mark()
            result = await client.publish(subject, f"m{n}".encode(), timeout=15)
            if result.ok:
                assert result.position is not None
                on_ack(marked, result.position.seq)

        async with trio.open_nursery() as nursery:
            n = 0
            while trio.current_time() < until:
                nursery.start_soon(one, n)
                n += 1
                await trio.sleep(1 / rate)
