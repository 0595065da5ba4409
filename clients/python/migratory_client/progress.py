"""Whether a connection's writes are moving: the bytes it hands to the kernel, counted.

A write is stalled when no byte of it has gone out for the keepalive timeout -- not when
it cannot finish within that time: a large publish on a slow but moving link is not
given up (given up, its session is torn down and its outcome is unknown). A peer that
stops reading stops the count, and the write is given up the timeout after the last
byte that went out.

:class:`ProgressStream` sits between trio-websocket and the TCP (or TLS) stream and
hands a write down in pieces of ``WRITE_CHUNK`` bytes, counting each piece the stream
took; :meth:`WriteProgress.stall_after` is the time limit a write runs under, pushed
back by every piece.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import trio

__all__ = ["WRITE_CHUNK", "ProgressStream", "WriteProgress"]

WRITE_CHUNK = 64 * 1024
"""Bytes handed to the stream at a time: the grain at which progress is seen (a link
that moves less than this in the timeout is stalled)."""


class WriteProgress:
    """Bytes written on one connection, and the time limit of the write under way."""

    def __init__(self) -> None:
        self.bytes_written = 0
        self.bytes_read = 0  # (a heartbeat's silence: nothing read, Session._watch_silence)
        self._limit: trio.CancelScope | None = None
        self._timeout = 0.0

    @contextmanager
    def stall_after(self, timeout: float) -> Iterator[trio.CancelScope]:
        """A scope cancelled once no byte has been written for ``timeout`` s; the
        caller checks ``cancelled_caught``, as with :func:`trio.move_on_after`."""
        with trio.move_on_after(timeout) as scope:
            self._limit, self._timeout = scope, timeout
            try:
                yield scope
            finally:
                self._limit = None

    def wrote(self, count: int) -> None:
        self.bytes_written += count
        if self._limit is not None:
            self._limit.deadline = trio.current_time() + self._timeout


class ProgressStream(trio.abc.Stream):
    """``inner``, with every byte it takes (and every byte read from it) counted in
    ``progress``."""

    def __init__(self, inner: trio.abc.Stream, progress: WriteProgress) -> None:
        self.inner = inner
        self.progress = progress

    async def send_all(self, data: bytes | bytearray | memoryview) -> None:
        if not data:
            await self.inner.send_all(data)
            return
        view = memoryview(data)
        for start in range(0, len(view), WRITE_CHUNK):
            piece = view[start : start + WRITE_CHUNK]
            await self.inner.send_all(piece)
            self.progress.wrote(len(piece))

    async def wait_send_all_might_not_block(self) -> None:
        await self.inner.wait_send_all_might_not_block()

    async def receive_some(self, max_bytes: int | None = None) -> bytes | bytearray:
        data = await self.inner.receive_some(max_bytes)
        self.progress.bytes_read += len(data)
        return data

    async def aclose(self) -> None:
        await self.inner.aclose()
