"""The writing side of a client connection (:class:`~migratory.server.connection.Connection`).

Writes go straight to the non-blocking socket (``sock.send``) from whoever triggers
them -- the batch tick, a full batch, the session's own replies -- one ``send`` per
batch; only when the kernel buffer is full does a drain task wait for writability.
With ``SendPath = io_uring`` the batch goes to the server's ring and :meth:`sent`
follows. On an encrypted listener a batch is sealed into one TLS write, and a partly
sent encrypted batch waits in ``_cipher`` (at most one batch) before the next is taken.

A Server-Sent Events stream catching up has a backlog that goes into its outbox only as
the socket drains (``Session.refill``, sse_stream.py), by the drain task alone, which
waits for its turn of the event loop before each refill and pays the work it did
(loop_turns.py), as a connection's reader does for each step of what it read: a herd of
streams resuming is caught up a bounded amount per turn. (The refills were done by
whoever flushed -- the reader handling the request, the batch tick, every stream whose
socket had room -- all in one turn: 300 streams resuming 10 subjects each, ~50 messages
back, held the loop 3.1 s; docs/benchmarks.md.)
"""

from __future__ import annotations

import errno
import socket
from typing import TYPE_CHECKING, cast

import trio

from migratory.server.metric_buckets import BatchSizes
from migratory.server.session_subscriptions import SLICE_UNITS
from migratory.server.tcp_progress import bytes_acked, unacknowledged_bytes
from migratory.server.tls_link import TlsFailed, TlsLink

if TYPE_CHECKING:
    from migratory.server.app import Server
    from migratory.server.connection import Connection
    from migratory.server.mqtt_session import MqttSession
    from migratory.server.session import Session

BATCH_LIMIT = BatchSizes.LIMIT


class ConnectionWrites:
    """Moving a session's outbox to its socket; the reading side is the subclass's."""

    __slots__ = ("_cipher", "_fd", "_flying", "_marked", "writing")

    # set by the subclass (Connection)
    server: Server
    sock: socket.socket
    session: Session | MqttSession
    _tls: TlsLink | None
    _closed: bool
    _answered: trio.Event | None
    _read_scope: trio.CancelScope | None
    pending: bool

    def count_frontend(self) -> None:
        raise NotImplementedError  # Connection: the server's count per front end

    def _start_writes(self, sock: socket.socket) -> None:
        self._cipher = b""  # encrypted bytes of a batch the socket took only part of
        self.writing = False  # a partial write is pending; a drain task owns the socket
        self._flying = False  # a send through the server's io_uring is in flight (SendPath)
        self._fd = sock.fileno()
        self._marked = False  # told the server since the last flush (mark_dirty)

    def _abort(self) -> None:
        raise NotImplementedError  # Connection: close at once

    # --- Link (called by the session) -------------------------------------------

    def mark_dirty(self) -> None:
        """Bytes wait: tell the server once per batch, not once per frame (every flush
        writes all that waits, or leaves it to a drain task that does)."""
        if not self._marked:
            self._marked = True
            server = self.server
            if server.processing is not self:  # else it flushes itself when done
                server.mark_dirty(cast("Connection", self))

    def flush_now(self) -> None:
        self.flush()

    def untaken(self) -> str:
        """What of its output the client has not taken, for a log line: a client that
        stopped reading (or a path to it that stopped) shows bytes left in both places."""
        outbox = self.session.outbox
        unacked = unacknowledged_bytes(self.sock)
        acked = bytes_acked(self.sock)
        return (
            f"{len(outbox)} frames ({outbox.pending_bytes} bytes) not written, "
            f"{'?' if unacked is None else unacked} bytes written and not acknowledged, "
            f"{'?' if acked is None else acked} acknowledged in all"
        )

    # --- writing ------------------------------------------------------------------

    def flush(self) -> None:
        """Write the pending batch with one ``send``; leave the rest to a drain task."""
        self._marked = False
        if self._answered is not None:
            self._answered.set()  # the reader looks whether its request was answered
        if self._closed:
            return
        if self.pending:  # an answer may have started a stream or a WebSocket
            self.count_frontend()
        session = self.session
        if session.aborted:
            self._abort()
            return
        if not self.writing:
            pending = session.outbox if self._tls is None else self._pending()
            if (pending and not self._write()) or (session.refilling and not self.writing):
                # the socket is full, or a stream's backlog waits: the drain task writes
                # (and refills, in its turns of the loop) each time the socket has room
                self.writing = True
                self.server.nursery.start_soon(self._drain)
        if session.closing and self._read_scope is not None:
            self._read_scope.cancel()  # the reader task finishes the close

    def _pending(self) -> bool:
        tls = self._tls
        return bool(self.session.outbox or self._cipher or (tls is not None and tls.has_output))

    def _write(self) -> bool:
        """One ``send`` of everything pending; True when all of it went out."""
        if self._tls is not None:
            return self._write_encrypted()
        outbox = self.session.outbox
        ctx = self.server.ctx
        frames = len(outbox)
        if frames <= BATCH_LIMIT:  # BatchSizes.observe inlined: once per write
            ctx.batch_sizes.sizes[frames] += 1
        else:
            ctx.batch_sizes.observe(frames)
        batch = outbox.take()
        uring = self.server.uring
        if uring is not None:  # SendPath = io_uring: sent() follows
            self.writing = self._flying = True
            uring.send(self._fd, batch, self)
            return True
        try:
            sent = self.sock.send(batch)
        except BlockingIOError:
            sent = 0
        except OSError:
            self._abort()
            return True
        stats = ctx.stats
        stats.writes += 1
        stats.bytes_written += sent
        if sent < len(batch):
            outbox.requeue_unsent(batch[sent:])
            return False
        return True

    def _write_encrypted(self) -> bool:
        tls = self._tls
        assert tls is not None
        frames = 0
        if self._cipher:  # the rest of a batch first, then whatever TLS queued meanwhile
            data = self._cipher + tls.take_output()
            self._cipher = b""
        elif self.session.outbox and tls.ready:  # the usual case: one batch, one TLS write
            frames = len(self.session.outbox)
            try:
                data = tls.seal(self.session.outbox.take())
            except TlsFailed:
                self._abort()
                return True
        else:
            data = tls.take_output()  # handshake records
        if not data:
            return True
        self.server.ctx.batch_sizes.observe(frames)  # 0: the rest of a batch, or handshake
        try:
            sent = self.sock.send(data)
        except BlockingIOError:
            sent = 0
        except OSError:
            self._abort()
            return True
        stats = self.server.ctx.stats
        stats.writes += 1
        stats.bytes_written += sent
        if sent < len(data):
            self._cipher = data[sent:]
            return False
        return not self.session.outbox or not tls.ready

    def sent(self, batch: bytes, result: int) -> None:
        """The io_uring's send of ``batch`` completed (``SendPath = io_uring``): bytes
        written, or ``-errno``. The rest of a short send goes back in front of the
        outbox; what was queued meanwhile is written now."""
        self._flying = self.writing = False
        if self._closed:
            self.sock.close()  # _abort left it open while the send was in flight
            return
        outbox = self.session.outbox
        if result == len(batch):  # the usual case
            stats = self.server.ctx.stats
            stats.writes += 1
            stats.bytes_written += result
            if outbox or self.session.refilling:
                self.flush()
            return
        if result < 0:
            if result != -errno.EAGAIN:
                self._abort()
                return
            outbox.requeue_unsent(batch)  # the socket was full: wait until it is not
            self.writing = True
            self.server.nursery.start_soon(self._drain)
            return
        stats = self.server.ctx.stats
        stats.writes += 1
        stats.bytes_written += result
        if result < len(batch):
            outbox.requeue_unsent(batch[result:])
        if self._pending() or self.session.refilling:
            self.flush()

    async def _drain(self) -> None:
        """Wait for writability until the outbox is empty (the kernel buffer was full),
        and a stream's backlog is sent: refilled, in the drain's turns of the event loop,
        each time the socket took what was queued."""
        try:
            while not self._closed:
                if self._pending():
                    await trio.lowlevel.wait_writable(self.sock)
                    if self._closed:
                        break
                    if not self._write():
                        continue
                    if self._flying:
                        break  # (through the io_uring: sent() carries on)
                if not self.session.refilling:
                    break
                await self._refill()
                if self._pending() and self._write() and self._flying:
                    break
        except (trio.ClosedResourceError, OSError):
            self._abort()
        finally:
            self.writing = self._flying  # its last write may have gone to the io_uring

    async def _refill(self) -> None:
        """One refill of a stream's backlog, in this connection's turn of the loop, the
        work it did paid to the server's budget (a step coming back, as a reader's)."""
        turns = self.server.turns
        reserved = await turns.turn(fresh=False)
        session = self.session
        done = session.work_done
        try:
            if not self._closed:
                session.refill(reserved or SLICE_UNITS, trio.current_time())
        finally:
            turns.paid(session.work_done - done, reserved)

