"""The trio adapter for one client socket: move bytes, nothing else.

Writes go straight to the non-blocking socket (``sock.send``) from whoever
triggers them — the batch tick, a full batch, the session's own replies —
and only when the kernel buffer is full does a drain task wait for
writability. Reads wait for readability and feed the session.
"""

from __future__ import annotations

import logging
import socket
from typing import TYPE_CHECKING

import trio

from migratory.protocol import close_codes
from migratory.server.session import Session

if TYPE_CHECKING:
    from migratory.server.app import Server

log = logging.getLogger("migratory.connection")

RECV_SIZE = 65536
CLOSE_LINGER_SECONDS = 2.0


class Connection:
    __slots__ = ("_closed", "_draining", "server", "session", "sock")

    def __init__(self, server: Server, sock: socket.socket, peer: str) -> None:
        self.server = server
        self.sock = sock
        self.session = Session(server.ctx, self, peer)
        self._draining = False
        self._closed = False

    # --- Link (called by the session) -------------------------------------------

    def mark_dirty(self) -> None:
        self.server.dirty.add(self)

    def flush_now(self) -> None:
        self.flush()

    # --- writing ------------------------------------------------------------------

    def flush(self) -> None:
        """Write the pending batch with one ``send``; leave the rest to a drain task."""
        session = self.session
        if self._closed:
            return
        if session.aborted:
            self._abort()
            return
        if self._draining or not session.outbox:
            return
        batch = session.outbox.take()
        try:
            sent = self.sock.send(batch)
        except BlockingIOError:
            sent = 0
        except OSError:
            self._abort()
            return
        stats = self.server.ctx.stats
        stats.writes += 1
        stats.bytes_written += sent
        if sent < len(batch):
            session.outbox.requeue_unsent(batch[sent:])
            self._draining = True
            self.server.nursery.start_soon(self._drain)

    async def _drain(self) -> None:
        try:
            while self.session.outbox and not self._closed and not self.session.aborted:
                await trio.lowlevel.wait_writable(self.sock)
                self._draining = False
                self.flush()
                if self._draining:  # flush started another drain task
                    return
        except (trio.ClosedResourceError, OSError):
            self._abort()
        finally:
            self._draining = False

    # --- reading ------------------------------------------------------------------

    async def run(self) -> None:
        """Serve the connection until it closes; never raises on client errors."""
        server = self.server
        session = self.session
        try:
            with trio.move_on_after(server.ctx.config.handshake_timeout):
                while not session.connected:
                    if not await self._read_once():
                        return
            if not session.connected:
                if session.is_websocket:
                    session.close(close_codes.CONNECT_TIMEOUT.code, "no connect in time")
                    self.flush()
                    await self._close_gracefully()
                return
            while await self._read_once():
                pass
        except (trio.ClosedResourceError, OSError):
            pass
        except Exception:
            log.exception("%s: internal error", session.describe())
            session.close(close_codes.INTERNAL_ERROR.code, "internal error")
            self.flush()
        finally:
            session.connection_lost()
            self._abort()

    async def _read_once(self) -> bool:
        """Read and process one chunk; False once the connection is over."""
        session = self.session
        await trio.lowlevel.wait_readable(self.sock)
        try:
            data = self.sock.recv(RECV_SIZE)
        except BlockingIOError:
            return True
        if not data:
            return False
        session.receive_data(data, trio.current_time())
        self.flush()
        if self.server.write_immediately:
            self.server.flush_dirty()
        if session.aborted:
            return False
        if session.closing:
            await self._close_gracefully()
            return False
        return True

    async def _close_gracefully(self) -> None:
        """Write what is queued (the close frame), half-close, wait briefly for the peer."""
        with trio.move_on_after(CLOSE_LINGER_SECONDS):
            while self.session.outbox and not self._closed and not self.session.aborted:
                await trio.sleep(0.01)
            if self._closed or self.session.aborted:
                return
            try:
                self.sock.shutdown(socket.SHUT_WR)
                while True:
                    await trio.lowlevel.wait_readable(self.sock)
                    if not self.sock.recv(RECV_SIZE):
                        break
            except OSError:
                pass

    def _abort(self) -> None:
        if self._closed:
            return
        self._closed = True
        self.server.forget(self)
        trio.lowlevel.notify_closing(self.sock)
        self.sock.close()
