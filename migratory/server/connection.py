"""The trio adapter for one client socket: move bytes, nothing else.

Writes go straight to the non-blocking socket (``sock.send``) from whoever
triggers them — the batch tick, a full batch, the session's own replies —
and only when the kernel buffer is full does a drain task wait for
writability. One reader task per socket waits for readability and feeds the
session; when the session wants to close, the reader stops reading, lets the
queued bytes (the close frame) drain, half-closes, waits briefly for the
peer, and closes.

On an encrypted listener a :class:`~migratory.server.tls_link.TlsLink` sits
between the socket and the session: bytes read are decrypted before the
session sees them, a batch is encrypted before its ``send``
(:mod:`migratory.server.connection_writes`: the writing side). The end -- the last
bytes, the linger for the client's, when the drain counts it gone -- is
:mod:`migratory.server.connection_linger`'s.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import socket
import ssl
import time
from collections.abc import Callable
from typing import TYPE_CHECKING

import trio

from migratory.entitlement_decisions import DecisionPending
from migratory.listeners import Listener
from migratory.protocol import close_codes
from migratory.server.connection_linger import RECV_SIZE, ConnectionLinger
from migratory.server.mqtt_session import MqttSession
from migratory.server.session import Session
from migratory.server.tcp_progress import bytes_acked
from migratory.server.tls_link import TlsFailed, TlsLink

if TYPE_CHECKING:
    from migratory.server.app import Server

log = logging.getLogger("migratory.connection")

OPERATIONS_PER_TURN = 64
"""Operations one connection may have processed before the others get a turn: one
client delays the others by milliseconds, whatever it sends (docs/security.md)."""


async def wait_for_decision(pending: DecisionPending) -> None:
    """Until the entitlement's answer is in or its deadline passed, the loop serving the
    others meanwhile; the session then asks again (an answer, or a denial)."""
    answered = trio.Event()
    token = trio.lowlevel.current_trio_token()

    def wake(_: object) -> None:
        with contextlib.suppress(trio.RunFinishedError):
            token.run_sync_soon(answered.set)

    pending.future.add_done_callback(wake)
    with trio.move_on_after(max(0.0, pending.deadline - time.monotonic())):
        await answered.wait()


def _client_fields(session: object) -> dict[str, object]:
    """The client as fields of a log record (a native session names itself fully)."""
    fields = getattr(session, "log_fields", None)
    return fields() if fields is not None else {"peer": getattr(session, "peer", None)}


class Connection(ConnectionLinger):
    __slots__ = (
        "_answered", "_closed", "_held", "_keep_alive", "_read_scope", "_taken", "_tls",
        "_unfinished",
        "address", "batch_slowly", "frontend", "handshaking", "listener", "pending", "server",
        "session", "sock",
    )

    def __init__(
        self,
        server: Server,
        sock: socket.socket,
        peer: str,
        listener: Listener,
        tls: ssl.SSLContext | None = None,
        *,
        address: str | None = None,
    ) -> None:
        """``address``: what the per-address limits count it as (its IP address's
        :func:`~migratory.server.front_rate.address_group`; default: its IP address)."""
        self.server = server
        self.sock = sock
        self.listener = listener
        self._tls = None if tls is None else TlsLink(tls)
        # written every EncryptedBatchTime, not every BatchTime (encrypted_batching.py)
        self.batch_slowly = tls is not None and server.encrypted is not None
        self._start_writes(sock)
        self.session: Session | MqttSession = self._new_session(peer)
        self.frontend = self.session.frontend  # as the server counts it (frontends.py)
        # the peer's IP address, or its IPv6 network (per-address limits)
        self.address = peer.rsplit(":", 1)[0] if address is None else address
        self.handshaking = True  # counted in the server's handshakes in flight (limits.py)
        # not a client session yet (in its handshake, or HTTP keep-alive between requests):
        # may be closed to make room for a newcomer (limits.py, MaxPendingHandshakes)
        self.pending = True
        self._held = 0  # bytes of incomplete frames counted in the server's budget
        self._closed = False
        self._read_scope: trio.CancelScope | None = None
        self._keep_alive: trio.CancelScope | None = None  # the HTTP phase's deadline
        self._taken = 0  # bytes the client had acknowledged at the last look
        self._unfinished = False  # steps of a read wait for later turns (_go_on)
        self._answered: trio.Event | None = None  # set once an HTTP request is answered
        self.leaving = ""  # closing: where its end is (connection_linger.py)

    def _new_session(self, peer: str) -> Session | MqttSession:
        return Session(self.server.ctx, self, peer, self.listener)

    @property
    def busy(self) -> bool:
        """An HTTP request of it waits for its answer (a publish for its commit), or
        answers of it wait to be written (a keep-alive client reading pipelined answers;
        HandshakeTimeout still cuts one that stops taking them): never closed to make
        room, its answers would be lost."""
        session = self.session
        return isinstance(session, Session) and (
            session.awaiting_answer or self._answers_waiting() is not None)

    def _requests_answered(self) -> int:
        session = self.session
        return session.requests_answered if isinstance(session, Session) else 0

    # --- reading ------------------------------------------------------------------

    async def run(self) -> None:
        """Serve the connection until it closes; never raises on client errors."""
        try:
            with trio.CancelScope() as self._read_scope:
                await self._read_until_closing()
            self._read_scope = None
            if self.session.closing and not self.session.aborted:
                await self._finish()
        except (trio.ClosedResourceError, OSError):
            pass
        except Exception:
            log.exception("%s: internal error", self.session.describe(),
                          extra=_client_fields(self.session))
        finally:
            # self.session, not the one the connection started with: a WebSocket upgrade
            # with subprotocol mqtt hands the connection to an MqttSession, whose will and
            # subscriptions must end with it
            session = self.session
            if isinstance(session, Session):
                session.finished()  # audits the disconnect
            else:
                session.connection_lost()
            self._abort()

    async def _read_until_closing(self) -> None:
        timeout = self.server.ctx.config.handshake_timeout
        try:
            # HTTP requests, then the handshake and `connect`, each within the timeout
            with trio.move_on_after(timeout) as deadline:
                self._keep_alive = deadline  # pushed on while answers are taken
                try:
                    while not self.session.connected:
                        answered = self._requests_answered()
                        if not await self._read_once():
                            return
                        if self._requests_answered() != answered:
                            deadline.deadline = trio.current_time() + timeout
                finally:
                    self._keep_alive = None
            session = self.session  # an MqttSession after a WebSocket upgrade to MQTT
            # the deadline cut the steps of the read that connected (a persistent session's
            # resume, the packets after its CONNECT): the handshake is over, they are
            # handled to their end -- cut, the client waited forever for the answer to a
            # packet left in the decoder
            if self._unfinished and session.connected and not await self._go_on(True):
                return
            if deadline.cancelled_caught and self.handshaking:
                self.server.refused("HandshakeTimeout", f"no handshake within {timeout} s "
                                    f"(HandshakeTimeout), from {self.address}")
            if not session.connected:
                if session.is_websocket:
                    session.close(close_codes.CONNECT_TIMEOUT.code, "no connect in time")
                return
            if not isinstance(session, MqttSession) or not session.keep_alive:
                while await self._read_once():
                    pass
                return
            while True:  # MQTT: cut off after 1.5 x keep-alive without a byte
                with trio.move_on_after(session.keep_alive * 1.5) as waited:
                    if not await self._read_once():
                        return
                if waited.cancelled_caught and self._unfinished:
                    # cut in the steps of what the client sent in time: not silent
                    if not await self._go_on(True):
                        return
                elif waited.cancelled_caught:
                    session.keep_alive_expired()
                    self.flush()
                    return
        except (trio.ClosedResourceError, trio.BrokenResourceError, OSError):
            raise
        except Exception:
            log.exception("%s: internal error", self.session.describe(),
                          extra=_client_fields(self.session))
            self.session.close(close_codes.INTERNAL_ERROR.code, "internal error")

    def _answers_waiting(self) -> float | None:
        """While an HTTP connection's answers wait to be written (its deadline running):
        how often to look whether its client takes them. None otherwise."""
        if self._keep_alive is None or not self._requests_answered():
            return None
        if not (self.writing or self._pending()):
            return None
        return self.server.ctx.config.handshake_timeout / 4

    def _answers_taken(self) -> None:
        """A client that acknowledged bytes since the last look is still reading its
        answers: the connection is not idle, its deadline runs from now. (It ran from
        the last answer queued: a client reading pipelined answers for longer than
        HandshakeTimeout lost the rest, left in its outbox.)"""
        taken = bytes_acked(self.sock)
        keep_alive = self._keep_alive
        if keep_alive is not None and taken is not None and taken > self._taken:
            self._taken = taken
            later = trio.current_time() + self.server.ctx.config.handshake_timeout
            keep_alive.deadline = max(keep_alive.deadline, later)

    async def _read_once(self) -> bool:
        """Read and process one chunk; False once the connection is over."""
        if self._closed:
            return False
        session = self.session
        if isinstance(session, Session) and session.awaiting_answer:
            await self._wait_for_answer(session)
            if self._closed or session.closing or session.aborted:
                return False
        look = self._answers_waiting()
        if look is not None:
            with trio.move_on_after(look) as waited:
                await trio.lowlevel.wait_readable(self.sock)
            if waited.cancelled_caught:
                self._answers_taken()
                return True
        elif not isinstance(session, Session) or session.heartbeat_interval is None:
            await trio.lowlevel.wait_readable(self.sock)
        else:
            with trio.move_on_after(session.heartbeat_interval) as idle:
                await trio.lowlevel.wait_readable(self.sock)
            if idle.cancelled_caught:
                session.heartbeat()
                self.flush()
                return not (session.aborted or session.closing)
        turns = self.server.turns
        # the loop's work per turn (loop_turns.py); bytes that came before the handshake
        # deadline are not cut by it while they wait in the server's queue
        with trio.CancelScope(shield=self._keep_alive is not None):
            reserved = await turns.turn(fresh=True)
        done = self.session.work_done
        try:
            if self._closed:  # (closed while it waited)
                return False
            try:
                data = self.sock.recv(RECV_SIZE)
            except BlockingIOError:
                return True
            more = self._take(data, reserved or OPERATIONS_PER_TURN)
        finally:
            turns.paid(self.session.work_done - done, reserved)
        if more is None:
            return False
        return await self._go_on(more)

    async def _go_on(self, more: bool) -> bool:
        """The steps left of what was read, each in a later turn of the loop; False once
        the connection is over. ``_unfinished`` while they go on: a deadline that cuts
        them (the handshake's, once the session is connected) leaves them to be resumed."""
        turns = self.server.turns
        self._unfinished = more
        while more:  # the others' turn between two steps; nothing more is read meanwhile
            waiting = self.session
            reserved = 0
            if waiting.decision_pending is not None:
                # the plugin decides in its thread; the loop serves the others meanwhile
                pending, waiting.decision_pending = waiting.decision_pending, None
                await wait_for_decision(pending)
            else:
                reserved = await turns.turn(fresh=False)
            native = self.session
            done = native.work_done
            try:
                if self._closed:  # aborted meanwhile (a failed write): its socket is gone
                    return False
                more = self._step(functools.partial(
                    native.process, trio.current_time(), reserved or OPERATIONS_PER_TURN))
            finally:
                turns.paid(native.work_done - done, reserved)
        self._unfinished = False
        session = self.session
        if self._tls is not None and self._tls.closed:
            return False  # the peer's close_notify: a TCP end, once what it sent is handled
        return not (session.aborted or session.closing)

    def _take(self, data: bytes, step: int) -> bool | None:
        """Process what was read, the first ``step`` operations of it; True when more
        is left, None when the connection is over (the peer closed, TLS failed)."""
        if self._tls is not None:
            plain = self._decrypt(data)
            if plain is None:
                return None
            data = plain
        elif not data:
            return None
        if not data:  # (TLS records without application data)
            return self._step(lambda: False)
        self.server.ctx.stats.bytes_read += len(data)
        now = trio.current_time()

        def first() -> bool:
            native = self.session
            more = native.receive_data(data, now, budget=step)
            if isinstance(native, Session) and native.mqtt_upgrade is not None:
                more = self._become_mqtt(now)  # True: a decision is pending
            return more

        return self._step(first)

    def _step(self, work: Callable[[], bool]) -> bool:
        """Run one step of processing, then account and write what it produced."""
        self.server.processing = self  # idle writes wait for _after_processing
        try:
            more = work()
        except BaseException:
            self._processing_failed()
            raise
        self._after_processing()
        return more

    async def _wait_for_answer(self, session: Session) -> None:
        """An HTTP request waits for its answer (a publish for its commit): nothing more is
        read until then, so pipelined bytes wait in the kernel (TCP flow control holds
        the client back) instead of piling up in the parser. The handshake deadline
        bounds the wait."""
        while session.awaiting_answer and not (self._closed or session.closing or
                                               session.aborted):
            self._answered = trio.Event()
            try:
                await self._answered.wait()
            finally:
                self._answered = None

    def _processing_failed(self) -> None:
        server = self.server
        server.processing = None
        server.wake_idle_writes()  # what the processing delivered before it failed

    def _after_processing(self) -> None:
        """Account the handshake and the incomplete frames (limits.py), then write: this
        client's replies, then every idle subscriber the processing delivered to (in this
        task, at once: no wake-up of another task for them)."""
        server = self.server
        server.processing = None
        session = self.session
        if self.pending:  # (a client session's front end no longer changes)
            self.count_frontend()
        limits = server.admission
        # the handshake is over at `connect` (or CONNECT), or once an HTTP request was
        # answered: a keep-alive connection of the HTTP API (a publisher's pool) no longer
        # counts in MaxHandshakesPerAddress, only in MaxConnectionsPerAddress
        if self.handshaking and (session.connected or self._requests_answered()):
            self.handshaking = False
            limits.handshake_done(self)
        if self.pending and session.connected:  # a client session: never closed for room
            self.pending = False
            limits.connected(self)
            server.ctx.stats.handshakes_pending = limits.pending_handshakes
        held = session.buffered_bytes
        if held != self._held:
            if not limits.hold_incomplete(held - self._held):
                session.close(
                    close_codes.TRY_AGAIN_LATER.code,
                    "the server holds too many incomplete frames (IncompleteFrameBudget)",
                )
                held = 0  # closing freed what the decoder held
                limits.hold_incomplete(-self._held)
            self._held = held
        uring = server.uring
        if uring is not None:
            uring.hold()  # this client's replies and its deliveries: one submission
        try:
            self.flush()
            if server.write_immediately:
                server.flush_dirty()
            elif server.urgent:
                server.write_urgent()
        finally:
            if uring is not None:
                uring.release()

    def count_frontend(self) -> None:
        """Move this connection in the server's count to its session's front end, if
        that changed (an upgrade, a stream: frontends.py)."""
        frontend = self.session.frontend
        if frontend != self.frontend and not self._closed:
            self.server.frontends.moved(self.frontend, frontend)
            self.frontend = frontend

    def _become_mqtt(self, now: float) -> bool:
        """The WebSocket upgrade chose subprotocol ``mqtt``: an MQTT session takes over
        the connection (and the 101 answer queued in the outbox). True when the bytes
        after the request wait for an entitlement decision."""
        native = self.session
        assert isinstance(native, Session)
        trailing = native.mqtt_upgrade or b""
        native.mqtt_upgrade = None
        mqtt = MqttSession(
            self.server.ctx, self, native.peer, self.server.mqtt_sessions, self.listener,
            websocket=True,
        )
        mqtt.outbox = native.outbox
        self.session = mqtt
        # bytes of one read, all handled (bounded) unless a decision is pending
        return bool(trailing) and mqtt.receive_data(trailing, now)

    def _decrypt(self, data: bytes) -> bytes | None:
        """The plaintext in ``data``; None once the connection is over."""
        tls = self._tls
        assert tls is not None
        if not data:
            return None  # the peer closed (with or without a close_notify)
        try:
            plain = tls.receive(data)
        except TlsFailed as exc:
            # anyone can send garbage to a TLS port, thousands a second: counted in
            # migratory_protocol_errors_total{kind="tls"}, said once a minute
            unlogged = self.server.tls_failure_log.line("tls", trio.current_time())
            if unlogged is not None:
                more = f" ({unlogged} more TLS failures not logged)" if unlogged else ""
                log.info("%s: TLS failed: %s%s", self.session.describe(), exc, more,
                         extra=_client_fields(self.session))
            stats = self.server.ctx.stats
            stats.protocol_errors += 1
            stats.count(stats.protocol_error_kinds, "tls")
            return None
        if tls.has_output:
            self.flush()  # handshake records for the peer
        return plain

    def evict(self) -> None:
        """Close at once: the server needs the room for a newcomer (still in the
        handshake: nothing to say to the peer, nothing of its own to flush)."""
        self._abort()

    def _abort(self) -> None:
        if self._closed:
            return
        self._closed = True
        if self._answered is not None:
            self._answered.set()
        self.server.admission.hold_incomplete(-self._held)
        self._held = 0
        self.session.release()  # its bytes leave the OutboxMemoryBudget
        self.server.forget(self)
        trio.lowlevel.notify_closing(self.sock)
        if not self._flying:
            self.sock.close()
            return
        # a send in flight through the io_uring names the fd: sent() closes the socket once
        # it completes, and a send waiting for room (a reader that stopped) ends at once
        with contextlib.suppress(OSError):
            self.sock.shutdown(socket.SHUT_RDWR)
