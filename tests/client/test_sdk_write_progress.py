"""A write is stalled when no byte of it goes out for the keepalive timeout, not when
it cannot finish within that time (migratory_client.progress).

The SDK gave up any write that took longer than the timeout: a large publish on a slow
but moving link ended its session ("could not send for 0.5 s") and its outcome was
unknown, while the server was reading it all along. A peer that stops reading must still
end the session, the timeout after its last byte.
"""

from __future__ import annotations

import math
import socket
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import pytest
import trio
import trio.testing
from sdk_fake_server import FAST, trio_test
from sdk_raw_peer import RawLink, RawPeer
from sdk_raw_sessions import next_note

from migratory.protocol import ops
from migratory.protocol import websocket as ws
from migratory_client import Client, Keepalive, NotificationStatus, PublishOutcomeUnknown, connect
from migratory_client.progress import WRITE_CHUNK, ProgressStream, WriteProgress

KEEPALIVE = Keepalive(interval=60, timeout=0.5)
PAYLOAD = 16 * 2**20
STEP_BYTES = 64 * 1024
STEP_PAUSE = 0.01
"""The slow reader: 64 KiB every 10 ms (~6 MB/s), so the 16 MiB publish takes seconds
to go out, many times the 0.5 s timeout, while bytes move every few milliseconds."""


class SlowReader:
    """Reads a link's raw bytes ``STEP_BYTES`` at a time with a pause between, for at most
    ``steps`` reads, and decodes the client's operations from them."""

    def __init__(self, link: RawLink) -> None:
        self.link = link
        self.bytes_read = 0
        self.steps = 0
        self.ops: list[ops.ClientOp] = []
        self._decoder = ws.FrameDecoder(client_frames=True, max_message_size=2 * PAYLOAD)

    async def read(self, *, steps: int, until_ops: int) -> None:
        while self.steps < steps and len(self.ops) < until_ops:
            await trio.lowlevel.wait_readable(self.link.sock)
            try:
                data = self.link.sock.recv(STEP_BYTES)
            except BlockingIOError:
                continue
            if not data:
                return
            self.steps += 1
            self.bytes_read += len(data)
            for event in self._decoder.events(data):
                if isinstance(event, ws.BinaryMessage):
                    self.ops.append(ops.decode_client_op(event.data))
            await trio.sleep(STEP_PAUSE)


@asynccontextmanager
async def slow_link() -> AsyncIterator[tuple[Client, SlowReader]]:
    """A client with a session on a raw peer whose receive buffer is small (accepted
    sockets inherit it: little of a publish waits in the peer's kernel)."""
    peer = RawPeer()
    peer._listener.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, STEP_BYTES)
    try:
        async with connect([peer.url], reconnect=FAST, keepalive=KEEPALIVE) as client:
            link = await peer.accept()
            await link.accept_session()
            yield client, SlowReader(link)
    finally:
        peer.close()


@trio_test
async def test_a_large_publish_on_a_slow_but_moving_link_is_not_given_up() -> None:
    # Before: PublishOutcomeUnknown "connection lost while sending" (SERVER_DOWN "could
    # not send for 0.5 s"), the peer having read part of the 16 MiB it read steadily.
    async with slow_link() as (client, reader):
        steps = 4 * math.ceil(PAYLOAD / STEP_BYTES) + 100  # bounded whatever happens
        async with trio.open_nursery() as nursery:
            nursery.start_soon(lambda: reader.read(steps=steps, until_ops=2))
            await client.publish_nowait("/a/b", bytes(PAYLOAD))
            await client.publish_nowait("/a/b", b"after")  # the same session
        big, small = reader.ops
        assert isinstance(big, ops.Publish) and len(big.message.content) == PAYLOAD
        assert isinstance(small, ops.Publish) and small.message.content == b"after"
        assert reader.bytes_read > PAYLOAD


@trio_test
async def test_a_reader_that_stops_still_ends_the_session() -> None:
    # Dead-peer detection kept: the peer reads steadily, then stops reading entirely;
    # the publish is given up (outcome unknown: part of it went out) and SERVER_DOWN
    # says why. Before, it was given up while the peer still read (after 31-38 of 40 steps).
    async with slow_link() as (client, reader):
        async with trio.open_nursery() as nursery:
            nursery.start_soon(lambda: reader.read(steps=40, until_ops=1))
            with pytest.raises(PublishOutcomeUnknown):
                await client.publish_nowait("/a/b", bytes(PAYLOAD))
        assert reader.steps == 40 and 0 < reader.bytes_read < PAYLOAD
        down = await next_note(client, NotificationStatus.SERVER_DOWN)
        assert "could not send for 0.5 s" in (down.reason or "")


class PacedStream(trio.abc.Stream):
    """Takes one piece per ``pause`` s of (mock) time, for ``pieces`` pieces, then
    nothing more: a link that moves slowly, then dies."""

    def __init__(self, pause: float, pieces: int) -> None:
        self.pause = pause
        self.pieces = pieces
        self.taken = 0

    async def send_all(self, data: bytes | bytearray | memoryview) -> None:
        if self.taken == self.pieces:
            await trio.sleep_forever()
        await trio.sleep(self.pause)
        self.taken += 1

    async def wait_send_all_might_not_block(self) -> None:
        await trio.lowlevel.checkpoint()

    async def receive_some(self, max_bytes: int | None = None) -> bytes:
        await trio.sleep_forever()
        raise AssertionError("unreachable")

    async def aclose(self) -> None:
        await trio.lowlevel.checkpoint()


@pytest.mark.parametrize("pieces", [30, 12])
def test_the_stall_limit_is_pushed_back_by_each_piece_written(pieces: int) -> None:
    # 30 pieces, one per 0.2 s, under a 0.5 s limit: 6 s in all, written. The link dies
    # after 12: given up with exactly 12 pieces counted. Before the rule was time to
    # finish: 2 pieces.
    async def main() -> tuple[bool, int]:
        progress = WriteProgress()
        stream = ProgressStream(PacedStream(0.2, pieces), progress)
        with progress.stall_after(0.5) as limit:
            await stream.send_all(bytes(30 * WRITE_CHUNK))
        return limit.cancelled_caught, progress.bytes_written

    stalled, written = trio.run(main, clock=trio.testing.MockClock(autojump_threshold=0))
    assert stalled is (pieces < 30)
    assert written == pieces * WRITE_CHUNK
