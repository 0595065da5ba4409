"""The end of a client connection (:class:`~migratory.server.connection.Connection`):
its last bytes written, then the wait for the client's end, and the moment the drain
may count the client gone (:meth:`~migratory.server.drain.Drain.left`).

Once the session's last word is queued -- a WebSocket close frame, an SSE stream's
``close`` event, the end of an MQTT connection (MQTT 3.1.1 has no DISCONNECT from the
server) -- the connection writes what is queued (the statuses and PUBACKs of the
publishes in flight first), half-closes, and reads until the client's EOF, at most
:data:`CLOSE_LINGER_SECONDS`. The drain does not wait for that EOF, which a proxy or a
lazy client may hold back, once the client has what it needs:

- **a WebSocket** (native or MQTT over WebSocket, over TLS too: its records decrypted
  here): the client's close frame in answer -- it read every frame before ours -- or its
  TLS ``close_notify``, the TLS end of its stream;
- **an SSE stream, an MQTT connection over TCP** (TLS or not): neither protocol has an
  answer to the server's end; the client has what it needs once its TCP acknowledged
  every byte written and our FIN (:func:`~migratory.server.tcp_progress.end_taken`):
  nothing the member could still do would bring it more. Looked at after 0, 5, 10, 20
  ... ms, then every :data:`LOOK_MAX` (about 20 looks in the linger), and only while
  the drain waits for this client.

A client that does not take its bytes (its receive window closed) is never counted
gone: they are not acknowledged. :attr:`ConnectionLinger.leaving` says where a client
the drain still waits for is (the drain's last line names a few).
"""

from __future__ import annotations

import logging
import socket

import trio

from migratory.client_lines import lines
from migratory.protocol import websocket as ws
from migratory.server.connection_writes import ConnectionWrites
from migratory.server.tcp_progress import end_taken
from migratory.server.tls_link import TlsFailed

log = logging.getLogger("migratory.connection")

RECV_SIZE = 65536
CLOSE_LINGER_SECONDS = 5.0
ANSWER_HELD_MAX = 1 << 16
"""Bytes of a message under way a closing connection holds while it waits for the peer's
close frame; past them it waits for the peer's EOF alone."""
LOOK_FIRST = 0.005  # s: the first wait before looking again whether the end was taken
LOOK_MAX = 0.32  # s: the longest


def _answered(decoder: ws.FrameDecoder, data: bytes) -> bool | None:
    """Whether ``data`` brought the peer's close frame; None: it never will (a broken
    frame, or a message longer than :data:`ANSWER_HELD_MAX` under way: not kept)."""
    decoder.receive_data(data)
    try:
        while (event := decoder.next_event()) is not None:
            if isinstance(event, ws.CloseReceived):
                return True
    except ws.RemoteProtocolError:
        return None
    if decoder.closed or decoder.buffered > ANSWER_HELD_MAX:
        decoder.discard()
        return None
    return False


class ConnectionLinger(ConnectionWrites):
    """The closing side of a connection; the reading side is the subclass's."""

    __slots__ = ("leaving",)  # where its end is ("" until the session closes)

    async def _finish(self) -> None:
        """Let queued bytes (the close frame, after the statuses of the publishes still in
        flight; over TLS then our ``close_notify``) drain, half-close, wait briefly for the
        peer. A client still there when the linger ends is logged with what it had not
        taken (a client, or a path to it, that stopped reading: the member's diagnosis of a
        subscriber that got nothing)."""
        with trio.move_on_after(CLOSE_LINGER_SECONDS) as linger:
            self.leaving = "its last bytes not all written"
            self.flush()
            session = self.session
            while (self.writing or self._pending() or session.settling) and not self._closed:
                await trio.sleep(0.01)
            tls = self._tls
            if tls is not None and not self._closed and tls.end():  # close_notify, then FIN
                self.flush()
                while (self.writing or self._pending()) and not self._closed:
                    await trio.sleep(0.01)
            if self._closed:
                return
            self.sock.shutdown(socket.SHUT_WR)
            answer = getattr(session, "answer", None)  # a WebSocket's close frame in answer
            self.leaving = ("no close frame in answer" if answer is not None
                            else "its end not acknowledged")
            await self._linger(answer)
        if linger.cancelled_caught and not self._closed and self.leaving != "left":
            lines.log(log, logging.INFO, f"linger: {self.leaving}", "%s: %s within %g s: %s",
                      self.session.describe(), self.leaving, CLOSE_LINGER_SECONDS,
                      self.untaken(), extra=self._log_fields())
            self.server.drain.dropped(self)  # (its close, next, is not a client gone as told)

    def _log_fields(self) -> dict[str, object]:
        fields = getattr(self.session, "log_fields", None)  # (a native session's)
        return fields() if fields is not None else {"peer": getattr(self.session, "peer", None)}

    async def _linger(self, answer: ws.FrameDecoder | None) -> None:
        """Read until the peer's EOF; tell the drain once the client left (see above)."""
        look: float | None = 0.0 if answer is None else None  # (None: no looking)
        while True:
            if look is None:
                await trio.lowlevel.wait_readable(self.sock)
            else:
                with trio.move_on_after(look) as waited:
                    await trio.lowlevel.wait_readable(self.sock)
                if waited.cancelled_caught:
                    look = min(max(look * 2, LOOK_FIRST), LOOK_MAX)
                    drain = self.server.drain
                    if drain.waits_for(self) and end_taken(self.sock):
                        drain.left(self)  # its TCP holds everything, and the end
                        self.leaving = "left"
                        look = None
                    continue
            data = self.sock.recv(RECV_SIZE)
            if not data:
                return
            if answer is None:
                continue
            tls = self._tls
            if tls is not None:
                try:
                    data = tls.receive(data)
                except TlsFailed:
                    answer = None  # (its EOF alone)
                    continue
            answered = _answered(answer, data) if data else False
            if answered or (tls is not None and tls.closed):
                # it read every frame before the close, or ended its TLS stream: gone for
                # the drain, which does not wait for its EOF (a proxy's may come late)
                self.server.drain.left(self)
                self.leaving = "left"
                answered = True
            if answered is not False:
                answer = None
