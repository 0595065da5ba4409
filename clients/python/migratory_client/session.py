"""One session: a WebSocket connection to one server, from ``connect`` to its loss.

The session reads server operations and hands them to the :class:`Router`, answers
gaps with resubscriptions, and keeps the connection alive with protocol ``ping``s.
Every way the session can end becomes a :class:`SessionEnd`, never an exception.

The reader never waits for the application (the router pauses a subscription whose
buffer is full instead), so a pong or a close always gets read: a connection that
stops answering ends the session within the keepalive's ``interval + timeout`` (plus
the time to read the frames already received), whatever the application is doing --
and, when the server granted the heartbeat asked for in ``connect``, once nothing at all
came for twice the interval granted (:meth:`Session._watch_silence`).
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Awaitable, Sequence
from dataclasses import dataclass

import trio
from trio_websocket import ConnectionClosed, WebSocketConnection
from wsproto.connection import ConnectionState

from migratory.model.message import Message
from migratory.protocol import close_codes
from migratory.protocol.ops import (
    ClientOp,
    Connect,
    Connected,
    Deliver,
    OperationError,
    Ping,
    Pong,
    PublishStatus,
    SubjectStatus,
    Subscribe,
    SubscriptionRequest,
    UnknownOp,
    Unsubscribe,
    decode_server_op,
    encode_client_op,
)
from migratory_client.progress import WriteProgress
from migratory_client.routing import Router

__all__ = ["HandshakeFailed", "HandshakeTimeout", "Keepalive", "NotSent", "Session", "SessionEnd"]

log = logging.getLogger("migratory_client")

SUBPROTOCOL = "migratory.cbor"
MAX_FRAME_BYTES = 64 * 2**20
"""Largest server frame accepted: a recovery batch can hold a whole subject cache."""
CLOSE_TIMEOUT = 2.0
SUBSCRIBE_CHUNK = 100
LARGE_FRAME_BYTES = 1 << 20
"""Frames above this are decoded in a worker thread, and their messages handed over in
slices of ``DELIVER_SLICE`` with a checkpoint between: decoding is ~5-20 us of Python
work per message, so a 64 MiB batch of small messages (1.4 million) held the event loop,
and with it every task of the application, for 10-30 s."""
DELIVER_SLICE = 5_000
"""Most entries in one ``subscribe`` when the server does not say its
``MaxSubjectsPerSubscribe`` in ``connected`` (more close the session with 4000)."""


@dataclass(frozen=True, slots=True)
class Keepalive:
    """Send a protocol ``ping`` every ``interval`` s; no ``pong`` within ``timeout`` s = lost.

    ``heartbeat``: ask the server to write something at least every this many seconds
    (``connect``'s ``heartbeat``, docs/protocol.md "Heartbeats"); a server that grants an
    interval and then sends nothing -- not a byte -- for twice the interval granted is
    lost, with no round trip to wait for: a member frozen or cut off without a close is
    left after 4-5 s by default instead of the ping's ``interval + timeout`` (25 s: at
    110 messages/s, 2,750 messages, past the 1,000 a subject caches by default, and the
    resume lost them to a ``DATA_RESYNC``). None: ask for none (pings alone)."""

    interval: float = 15.0
    timeout: float = 10.0
    heartbeat: float | None = 2.0

    def __post_init__(self) -> None:
        if not (self.interval > 0 and self.timeout > 0):  # NaN too
            raise ValueError("Keepalive: interval and timeout must be > 0")
        if self.heartbeat is not None and not 0.001 <= self.heartbeat <= 3600:
            raise ValueError("Keepalive: heartbeat must be None or from 0.001 to 3600 s")

    @property
    def heartbeat_ms(self) -> int | None:
        """The interval asked for in ``connect``, in ms (None: none asked)."""
        return None if self.heartbeat is None else round(self.heartbeat * 1000)


@dataclass(frozen=True, slots=True)
class SessionEnd:
    """Why a session ended: a close by the server (``code``, its ``reason``), or a loss the
    client saw or decided (``code`` 1006). ``terminal``: the code forbids retrying.
    ``read_all``: the session handed over every frame the server sent before its close
    frame (only then does the close say anything about what was not answered)."""

    code: int
    reason: str | None
    terminal: bool = False
    by_server: bool = False
    read_all: bool = False

    @classmethod
    def closed(
        cls, exc: ConnectionClosed, *, read_all: bool = False, server_sent: bool = True
    ) -> SessionEnd:
        """``server_sent``: the close reason is the server's close frame (see
        :func:`server_sent_close`); else it is the client's verdict on a frame the server
        sent, which ends this session but says nothing against the next server."""
        code = exc.reason.code if exc.reason is not None else close_codes.ABNORMAL.code
        reason = exc.reason.reason if exc.reason is not None else None
        if not server_sent and code != close_codes.ABNORMAL.code:
            known = close_codes.BY_CODE.get(code)
            name = f" {known.name}" if known else ""
            return cls.by_client(f"bad frame from the server ({code}{name}: {reason or '-'})")
        terminal = not close_codes.should_reconnect(code)
        by_server = code != close_codes.ABNORMAL.code
        return cls(code, reason, terminal, by_server=by_server, read_all=by_server and read_all)

    @classmethod
    def by_client(cls, reason: str) -> SessionEnd:
        return cls(close_codes.ABNORMAL.code, reason)

    @property
    def untaken_not_published(self) -> bool:
        """The server closed with 4502 DRAINED -- it answered every publish it took before
        its close frame -- and the session read every frame up to that close: a publish
        still waiting was never taken (not published). Otherwise its outcome is unknown."""
        return self.by_server and self.read_all and self.code == close_codes.DRAINED.code

    def describe(self) -> str:
        if not self.by_server:
            return self.reason or close_codes.ABNORMAL.meaning
        known = close_codes.BY_CODE.get(self.code)
        name = f" {known.name}" if known else ""
        return f"closed with {self.code}{name}" + (f": {self.reason}" if self.reason else "")


def server_sent_close(ws: WebSocketConnection) -> bool:
    """Whether ``ws.closed`` is the server's close frame rather than trio-websocket's own
    verdict on what the server sent, which it reports alike (0.12.2): a frame wsproto
    cannot parse (masked, reserved bits, unknown opcode, invalid UTF-8) becomes a close
    reason 1002 / 1007 as if received, while wsproto's state stays OPEN; a message over
    ``max_message_size`` one of 1009 that the client sends (LOCAL_CLOSING). Only a close
    frame from the server moves the state to REMOTE_CLOSING, then CLOSED. Taken as
    the server's code, these ended the whole client (1002, 1007, 1009 are terminal)
    instead of failing over; test_sdk_misbehaving_server pins the library's behaviour."""
    state = getattr(getattr(ws, "_wsproto", None), "state", None)
    return state is None or state in (ConnectionState.REMOTE_CLOSING, ConnectionState.CLOSED)


class NotSent(ConnectionClosed):
    """The session ended before the operation's first byte was written: the server never
    got it (a publish may go out again on the next session, no duplicate possible)."""


class HandshakeFailed(Exception):
    """The server did not answer ``connect`` with ``connected`` in time."""


class HandshakeTimeout(HandshakeFailed):
    """The server said nothing within the time limit: it will not answer a close either."""


class Session:
    def __init__(
        self,
        ws: WebSocketConnection,
        server: str,
        session_id: int,
        router: Router,
        keepalive: Keepalive,
        progress: WriteProgress | None = None,
    ) -> None:
        self.ws = ws
        self._keepalive = keepalive
        self._progress = progress or WriteProgress()
        """The bytes the connection wrote (run_connection counts them): a write is
        stalled once none went out for the keepalive timeout."""
        self.server = server
        self.id = session_id
        self.server_name = ""
        self.subscribe_chunk = SUBSCRIBE_CHUNK
        self._router = router
        self.heartbeat: float | None = None
        """Seconds: the server writes at least this often (granted in ``connected``)."""
        self._large_frame = False  # the reader decodes and hands over one (seconds of work)
        self._ping_id = 0
        self._pong_id = 0
        self.frames_read = 0
        self.heartbeats_read = 0  # among them: a server that is idle, not one answering
        self._pong = trio.Event()
        self._end: SessionEnd | None = None
        self.frames_dropped = False
        """A write broke the connection: trio-websocket then drops the frames it has not
        handed over yet, and a close frame it reads afterwards still becomes the close
        reason (0.12.2, ``_abort_web_socket`` closes the message channel)."""
        self._writing = 0
        """Writes under way: one may be breaking the connection right now (trio-websocket
        drops the frames, and the reader may see the end before the write returns)."""
        self._subscribes_due = 0
        """Subscribes to go out on this session that were made before now: the ones it
        opens with, and those the application made since. A publish or an unsubscribe
        waits for them (:meth:`after_subscribes`), so that the server gets them in the
        order the application made them: a subscribe then a publish on its subject is
        delivered the message, also when both wait for the next session."""
        self._subscribes_sent = trio.Event()
        self._send_lock = trio.Lock()
        """One write at a time, taken before trio-websocket's own lock: an operation
        waiting for it has produced no byte yet, so once the session has ended it is
        known to be not sent (:class:`NotSent`). Behind trio-websocket's lock it would
        be written after the close (or fail on the broken stream) and count as unknown."""

    @property
    def is_open(self) -> bool:
        return self.ws.closed is None and self._end is None

    def ended_by(self, exc: ConnectionClosed, *, read_all: bool = False) -> SessionEnd:
        """The end that ``exc`` (the connection is closed) means for this session."""
        return SessionEnd.closed(exc, read_all=read_all, server_sent=server_sent_close(self.ws))

    def subscribe_due(self) -> None:
        """A subscribe is to go out on this session (call :meth:`subscribe_sent` after)."""
        self._subscribes_due += 1

    def subscribe_sent(self) -> None:
        self._subscribes_due -= 1
        if self._subscribes_due == 0:
            self._subscribes_sent.set()
            self._subscribes_sent = trio.Event()

    async def after_subscribes(self) -> None:
        """Wait until the subscribes due now are written (or the session ended)."""
        while self._subscribes_due and self._end is None:
            await self._subscribes_sent.wait()

    async def send(self, op: ClientOp) -> None:
        """Send one operation; raises trio_websocket.ConnectionClosed if the connection is
        gone, :class:`NotSent` (a ConnectionClosed) when not one byte of it was written.

        The write is shielded from the caller's cancellation, because a half-written frame
        would corrupt the connection; a write of which no byte goes out for the keepalive
        timeout (the server stopped reading) ends the session instead. A write that moves
        is not stalled however long it takes (a large publish on a slow link), and the
        timeout starts when this write's turn comes, not while it waits behind others: a
        server that reads every write is not stalled however many queue. A caller cancelled
        meanwhile gets its Cancelled once nothing was written: not NotSent, which would
        send it round for another session (and, the client closed by that same
        cancellation, raise ClientClosedError from a cancelled task).
        """
        payload = encode_client_op(op)
        try:
            await self._write(payload)
        except NotSent:
            await trio.lowlevel.checkpoint_if_cancelled()
            raise

    async def _write(self, payload: bytes) -> None:
        # Waiting for the lock is not timed: each write ahead moves (bytes go out at least
        # once per timeout) or ends the session (then this one is NotSent). Timing the
        # wait gave up a session whose server read every write, once enough were queued
        # (39 publishes of 256 KiB on a loaded box: "could not send for 0.3 s" from one
        # that had written nothing).
        async with self._send_lock:
            if not self.is_open:  # ended while this waited: nothing written
                raise NotSent(self.ws.closed)
            with trio.CancelScope(shield=True):
                with self._progress.stall_after(self._keepalive.timeout):
                    self._writing += 1
                    try:
                        await self.ws.send_message(payload)
                    except ConnectionClosed:
                        self.frames_dropped = True
                        raise
                    finally:
                        self._writing -= 1
                    return
                reason = f"could not send for {self._keepalive.timeout} s"
                if self._end is None:
                    self._end = SessionEnd.by_client(reason)
                await self._close_unresponsive(reason)
            raise ConnectionClosed(self.ws.closed)

    async def handshake(self, connect: Connect, timeout: float) -> Connected:
        """Send ``connect``, wait for ``connected``; raises HandshakeFailed, ConnectionClosed."""
        await self.send(connect)
        with trio.move_on_after(timeout):
            op: object = None
            while op is None or isinstance(op, UnknownOp):
                payload = await self.ws.get_message()
                op = decode_server_op(payload) if isinstance(payload, bytes) else payload
                if isinstance(op, UnknownOp):
                    self._router.on_unknown_op(op.name, self.server)
            if not isinstance(op, Connected):
                raise HandshakeFailed(f"expected 'connected', got {op!r}")
            self.server_name = op.server
            self.subscribe_chunk = op.max_subjects_per_subscribe or SUBSCRIBE_CHUNK
            asked = self._keepalive.heartbeat_ms
            if asked is not None and op.heartbeat_ms is not None:  # never less than asked
                self.heartbeat = max(asked, op.heartbeat_ms) / 1000
            return op
        raise HandshakeTimeout(f"no 'connected' within {timeout} s")

    async def subscribe(self, requests: Sequence[SubscriptionRequest]) -> None:
        """Send subscription requests, in as many ``subscribe`` operations as the server's
        limit asks (a reconnect resubscribes every subject at once); raises
        trio_websocket.ConnectionClosed."""
        chunk = self.subscribe_chunk
        for start in range(0, len(requests), chunk):
            part = requests[start : start + chunk]
            await self.send(Subscribe(tuple(part)))
            self._router.sent(self.id, part)

    async def serve(self, requests: Sequence[SubscriptionRequest]) -> SessionEnd:
        """Subscribe ``requests`` and run until the connection is lost; returns why."""
        if requests:
            self.subscribe_due()  # before anything else can send: no checkpoint until here
        try:
            async with trio.open_nursery() as nursery:
                nursery.start_soon(self._read, requests, nursery.cancel_scope)
                nursery.start_soon(self._keep_alive, nursery.cancel_scope)
                if self.heartbeat is not None:
                    nursery.start_soon(self._watch_silence, self.heartbeat, nursery.cancel_scope)
        finally:
            self._subscribes_sent.set()  # ended: nobody waits for them any more
        assert self._end is not None
        return self._end

    async def close(self, code: int, reason: str, timeout: float | None = None) -> None:
        """Close with ``code``; give up on the closing handshake after ``timeout`` s
        (default ``CLOSE_TIMEOUT``)."""
        with trio.move_on_after(CLOSE_TIMEOUT if timeout is None else timeout):
            await self.ws.aclose(code, reason)

    async def _close_unresponsive(self, reason: str) -> None:
        # The server is not answering: waiting long for its closing handshake is pointless.
        timeout = min(CLOSE_TIMEOUT, self._keepalive.timeout)
        await self.close(close_codes.GOING_AWAY.code, reason, timeout)

    def _finish(self, end: SessionEnd, scope: trio.CancelScope) -> None:
        if self._end is None:
            self._end = end
        self._subscribes_sent.set()
        scope.cancel()

    async def _read(
        self, requests: Sequence[SubscriptionRequest], scope: trio.CancelScope
    ) -> None:
        try:
            if requests:
                try:
                    await self._reply(self.subscribe(requests))
                finally:
                    self.subscribe_sent()
            while True:
                payload = await self.ws.get_message()
                self.frames_read += 1
                self._large_frame = len(payload) > LARGE_FRAME_BYTES
                try:
                    await self._dispatch(payload)
                finally:
                    self._large_frame = False
        except ConnectionClosed as exc:  # from get_message: every frame it kept was read
            read_all = not self.frames_dropped and self._writing == 0
            self._finish(self.ended_by(exc, read_all=read_all), scope)
        except OperationError as exc:
            self._finish(SessionEnd.by_client(f"server broke the protocol: {exc}"), scope)
            with trio.CancelScope(shield=True):
                await self.close(exc.close.code, exc.reason[:120])

    async def _dispatch(self, payload: str | bytes) -> None:
        if not isinstance(payload, bytes):
            raise OperationError(close_codes.UNSUPPORTED_DATA, "text frame from the server")
        if len(payload) > LARGE_FRAME_BYTES:  # pure: abandoned if the session ends first
            op = await trio.to_thread.run_sync(decode_server_op, payload, abandon_on_cancel=True)
        else:
            op = decode_server_op(payload)
        if isinstance(op, Deliver):
            for start in range(0, len(op.messages), DELIVER_SLICE):
                if start:  # cancelled here, the rest comes again on resume: no gap
                    await trio.lowlevel.checkpoint()
                await self._deliver(op.messages[start : start + DELIVER_SLICE])
        elif isinstance(op, SubjectStatus):
            requests = self._router.on_subject_status(op, self.server, self.id)
            if requests:
                await self._reply(self.subscribe(requests))
        elif isinstance(op, PublishStatus):
            self._router.on_publish_status(op, self.server)
        elif isinstance(op, Pong):
            if op.id is None and self.heartbeat is not None:  # a heartbeat answers no ping
                self.heartbeats_read += 1
            else:
                self._on_pong(op.id)
        elif isinstance(op, UnknownOp):
            self._router.on_unknown_op(op.name, self.server)

    async def _deliver(self, messages: Sequence[Message]) -> None:
        reaction = self._router.on_messages(messages)
        if reaction.pause:
            await self._reply(self.send(Unsubscribe(reaction.pause)))
        if reaction.resubscribe:
            await self._reply(self.subscribe(reaction.resubscribe))

    @staticmethod
    async def _reply(sending: Awaitable[None]) -> None:
        """A send by the reader: when the connection is closed, read on -- the frames
        received before the close (statuses among them) still count, and get_message
        ends the session once they are all read."""
        with contextlib.suppress(ConnectionClosed):
            await sending

    def _on_pong(self, ping_id: int | None) -> None:
        # a pong answers at most the last ping sent: one with a later id (a server's bug)
        # must not stand for pings not sent yet, or a dead connection would go unnoticed
        answered = self._ping_id if ping_id is None else min(ping_id, self._ping_id)
        self._pong_id = max(self._pong_id, answered)
        self._pong.set()

    async def _keep_alive(self, scope: trio.CancelScope) -> None:
        keepalive = self._keepalive
        try:
            while True:
                await trio.sleep(keepalive.interval)
                if not await self._ping(keepalive.timeout):
                    reason = f"no pong within {keepalive.timeout} s"
                    self._finish(SessionEnd.by_client(reason), scope)
                    with trio.CancelScope(shield=True):
                        await self._close_unresponsive(reason)
                    return
        except ConnectionClosed as exc:
            # The reader ends the session once it has read every frame received before
            # the close; a reader that cannot (trio-websocket stuck writing its close
            # reply) is not waited for beyond the timeout, and then nothing is known.
            await trio.sleep(keepalive.timeout)
            self._finish(self.ended_by(exc), scope)

    async def _watch_silence(self, heartbeat: float, scope: trio.CancelScope) -> None:
        """The server writes at least every ``heartbeat`` s: nothing from it for twice that
        -- no byte read, no frame, the reader not busy with a large one (trio-websocket
        reads nothing more meanwhile) -- ends the session. No round trip: a member frozen
        or cut off without a close is left within 2-2.5 intervals, while the cache still
        holds what the resume needs."""
        limit, progress = 2 * heartbeat, self._progress
        heard, last = (progress.bytes_read, self.frames_read), trio.current_time()
        while True:
            due = trio.current_time() + limit / 4
            await trio.sleep(limit / 4)
            now = trio.current_time()
            news = (progress.bytes_read, self.frames_read)
            # woken late: this process stood still (a loaded machine), not the server
            if news != heard or self._large_frame or now - due > limit / 4:
                heard, last = news, now
            elif now - last >= limit:
                reason = f"nothing from the server for {limit:g} s (heartbeat {heartbeat:g} s)"
                self._finish(SessionEnd.by_client(reason), scope)
                with trio.CancelScope(shield=True):
                    await self._close_unresponsive(reason)
                return

    async def _ping(self, timeout: float) -> bool:
        """Whether the server is alive: it answered, or frames kept arriving (a large
        answer ahead of the pong; the reader never waits for the application, so frames
        stop soon after a connection dies: only what was already buffered is left)."""
        self._ping_id += 1
        await self.send(Ping(self._ping_id))
        while self._pong_id < self._ping_id:
            # (a heartbeat is no answer ahead of the pong: sent idle, it shows the ping unread)
            frames_before = self.frames_read - self.heartbeats_read
            self._pong = trio.Event()
            with trio.move_on_after(timeout):
                await self._pong.wait()
                continue
            if self.frames_read - self.heartbeats_read == frames_before:
                return False
        return True
