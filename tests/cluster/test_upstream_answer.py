"""How long a non-seed waits for a seed that took its dial (cluster/upstream.py
``UPSTREAM_SILENCE``, cluster/link_io.py ``connect``'s ``answer_within``).

A stopped seed (SIGSTOP, a frozen VM) still has its kernel accept the TCP dial and then
says nothing. A non-seed whose next pick was such a seed waited for the handshake's 5 s,
then asked it whether it speaks TLS (7 s more): ~12 s without a seed, its clients sent
away (1013) after 4 s of them. Measured with real processes (3 seeds behind gates and a
non-seed, one seed SIGSTOPped, the non-seed's upstream reset and the third seed's gate
closed for 1 s): 12.5-13.0 s from the reset to the next link, a subscriber's stream
silent 12.7-13.3 s. Now each answer of the handshake must come within
``UPSTREAM_SILENCE``, the bound the link itself keeps once made: 2.0-2.4 s, no client
sent away.

A seed at full load answering each step late, but within that bound, is followed."""

from __future__ import annotations

import logging
import socket

import pytest
import trio
import trio.testing
from listen_ports import listen_port

from cluster import link
from cluster.coordination import UNNUMBERED_EPOCH
from cluster.forwarding import Outgoing
from cluster.link_io import LinkChannel
from cluster.publishing import ClusterPublishing
from cluster.replica import Replica
from cluster.stream import CommittedStream
from cluster.upstream import UPSTREAM_SILENCE, UpstreamReplication
from migratory.server.hub import Hub

PASSWORD = "upstream-answer"
LATE = 0.9 * UPSTREAM_SILENCE
"""How late the busy seed sends each of its answers."""


def non_seed(port: int) -> UpstreamReplication:
    stream = CommittedStream(ClusterPublishing(origin="n#1", replica=Replica(Hub(
        epoch=UNNUMBERED_EPOCH))))
    return UpstreamReplication(
        name="127.0.0.1:1", seeds=[("127.0.0.1", port)], password=PASSWORD, stream=stream,
        outgoing=Outgoing(stream.publishing), max_frame=link.MAX_FRAME)


async def held_by_a_frozen_seed(port: int) -> float:
    """How long ``_follow`` stays with a seed whose kernel takes the dial (a listening
    socket never accepted from: what a SIGSTOPped process's is)."""
    frozen = socket.create_server(("127.0.0.1", port), backlog=8)
    try:
        start = trio.current_time()
        with trio.fail_after(60):  # a hang guard, not the assertion
            await non_seed(port)._follow(("127.0.0.1", port))
        return trio.current_time() - start
    finally:
        frozen.close()


def test_a_frozen_seed_holds_a_non_seed_no_longer_than_the_upstream_silence(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.WARNING, logger="migratory.cluster")
    port = listen_port()
    held = trio.run(held_by_a_frozen_seed, port,
                    clock=trio.testing.MockClock(autojump_threshold=0))
    assert held == pytest.approx(UPSTREAM_SILENCE, abs=0.01)  # before: 12.0
    assert [r.getMessage() for r in caplog.records] == [
        f"seed 127.0.0.1:{port} took the dial but said nothing (no answer within "
        f"{UPSTREAM_SILENCE:g} s: stopped, or too busy to keep a link); trying another"]


class LateStream(trio.abc.Stream):
    """A busy seed's side of a link: each write goes out ``LATE`` seconds after it was
    asked for (its event loop held by its load)."""

    def __init__(self, inner: trio.abc.Stream) -> None:
        self.inner = inner

    async def send_all(self, data: bytes | bytearray | memoryview) -> None:
        await trio.sleep(LATE)
        await self.inner.send_all(data)

    async def wait_send_all_might_not_block(self) -> None:
        await self.inner.wait_send_all_might_not_block()

    async def receive_some(self, max_bytes: int | None = None) -> bytes | bytearray:
        return await self.inner.receive_some(max_bytes)

    async def aclose(self) -> None:
        await self.inner.aclose()


async def followed_from_a_busy_seed(port: int) -> tuple[str | None, int | None, int]:
    """A seed answering every step of the handshake, and its heartbeats, ``LATE``: where
    the non-seed stands after 10 s, and how many times it left."""
    name = f"127.0.0.1:{port}"
    listeners = await trio.open_tcp_listeners(port, host="127.0.0.1")

    async def busy_seed(stream: trio.SocketStream) -> None:
        channel = LinkChannel(LateStream(stream), role="accept", member=name,
                              password=PASSWORD)
        await channel.handshake()
        assert isinstance(await channel.receive(), link.Replicate)
        while True:
            await channel.send(link.Heartbeat(0, True))

    upstream = non_seed(port)
    async with trio.open_nursery() as nursery:
        await nursery.start(trio.serve_listeners, busy_seed, listeners)
        nursery.start_soon(upstream._follow, ("127.0.0.1", port))
        await trio.sleep(10)
        view, switches = upstream.view, upstream.switches
        nursery.cancel_scope.cancel()
    return view.seed, view.heartbeat_clsn, switches


def test_a_busy_seed_answering_each_step_late_is_followed_not_left(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.WARNING, logger="migratory.cluster")
    port = listen_port()
    seed, heard, switches = trio.run(followed_from_a_busy_seed, port,
                                     clock=trio.testing.MockClock(autojump_threshold=0))
    assert (seed, heard, switches) == (f"127.0.0.1:{port}", 0, 0)
    assert caplog.records == []
