"""The client: one object per application, sessions come and go underneath.

``async with connect(servers=[...]) as client:`` starts a background task that keeps a
session open to one of the servers (weighted random choice, back-off between
attempts, another server preferred after a failure), resubscribes every subject from
its last delivered position after each reconnect, and ends the client with an
exception when a server closes with a terminal code.
"""

from __future__ import annotations

import contextlib
import inspect
import itertools
import random
import secrets
import ssl
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable, Mapping
from contextlib import asynccontextmanager

import trio
from trio_websocket import ConnectionClosed, HandshakeError, WebSocketConnection

from migratory.model.message import Message, Qos
from migratory.model.subject import validate_subject
from migratory.protocol import close_codes
from migratory.protocol.ops import Connect, OperationError, Publish, Unsubscribe
from migratory_client.backoff import Backoff, ReconnectPolicy
from migratory_client.errors import (
    ClientClosedError,
    ConnectionClosedError,
    MigratoryError,
    NotConnectedError,
    PublishOutcomeUnknown,
    ServerUnavailableError,
)
from migratory_client.events import Notification, NotificationStatus, PublishResult
from migratory_client.notifications import NotificationQueue
from migratory_client.progress import WriteProgress
from migratory_client.resume import SubjectTracker
from migratory_client.routing import Outlet, PendingPublish, Router
from migratory_client.servers import ServerEntry, choose_server, parse_servers
from migratory_client.session import (
    MAX_FRAME_BYTES,
    SUBPROTOCOL,
    HandshakeFailed,
    HandshakeTimeout,
    Keepalive,
    NotSent,
    Session,
    SessionEnd,
)
from migratory_client.subscription import Subscription
from migratory_client.transport import describe_connect_failure, run_connection, single_error

__all__ = ["Client", "connect"]

DEFAULT_MESSAGE_BUFFER = 10_000
DEFAULT_NOTIFICATION_BUFFER = 10_000
SEND_ATTEMPTS = 100
"""Sessions a publish may be handed to in turn while each ends before it is written
(NotSent; besides its timeout, what bounds the loop)."""


TokenProvider = Callable[[], "str | Awaitable[str | None] | None"]


class Client:
    """Use :func:`connect` to get one."""

    def __init__(
        self,
        servers: tuple[ServerEntry, ...],
        *,
        token: str | None,
        name: str,
        reconnect: ReconnectPolicy,
        token_provider: TokenProvider | None = None,
        keepalive: Keepalive,
        message_buffer: int,
        rng: random.Random,
        tls: ssl.SSLContext | None = None,
    ) -> None:
        if message_buffer < 1:
            raise ValueError("message_buffer must be >= 1")
        self._servers = servers
        self._tls = tls
        self._connect_op = Connect(client=name, token=token, heartbeat_ms=keepalive.heartbeat_ms)
        self._token_provider = token_provider
        self._policy = reconnect
        self._keepalive = keepalive
        self._message_buffer = message_buffer
        self._rng = rng
        self._backoff = Backoff(reconnect, rng)
        self._notifications = NotificationQueue(DEFAULT_NOTIFICATION_BUFFER)
        self._router = Router(self._notifications)
        self._session_ids = itertools.count(1)
        self._closure_prefix = secrets.token_hex(6)
        self._closures = itertools.count(1)
        self._live: Session | None = None
        self._live_changed = trio.Event()
        self._nursery: trio.Nursery | None = None
        # Shielded so that an outer cancellation still lets aclose() say goodbye
        # (its closing handshake needs the session's reader); aclose() cancels it.
        self._run_scope = trio.CancelScope(shield=True)
        self._error: MigratoryError | None = None
        self._last_down: str | None = None  # why the last session ended, or failed to open
        self._closed = False

    # --- state ----------------------------------------------------------------

    @property
    def server(self) -> str | None:
        """URL of the server of the open session, if any."""
        return self._live.server if self._live is not None else None

    @property
    def error(self) -> MigratoryError | None:
        """Why the client ended, if it ended by itself."""
        return self._error

    @property
    def unknown_ops(self) -> Mapping[str, int]:
        """Server operations of no protocol version this client speaks, by ``op``, with
        how many came: each was ignored (logged the first time), the session went on."""
        return dict(self._router.unknown_ops)

    def notifications(self) -> NotificationQueue:
        """Async iterator of :class:`Notification`. Never blocks the client: when nobody
        reads, the oldest are dropped (``.dropped`` counts them)."""
        return self._notifications

    async def wait_connected(self) -> str:
        """Wait until a session is open; returns the server URL."""
        return (await self._wait_live()).server

    async def _wait_live(self) -> Session:
        while True:
            self._raise_if_ended()
            live = self._live
            if live is not None and live.is_open:
                await live.after_subscribes()  # made before: they go out first
                if live.is_open:
                    return live
                continue
            await self._live_changed.wait()

    def _raise_if_ended(self) -> None:
        if self._error is not None:
            raise self._error
        if self._closed:
            raise ClientClosedError()

    def _set_live(self, session: Session | None) -> None:
        self._live = session
        self._live_changed.set()
        self._live_changed = trio.Event()

    # --- subscribe ------------------------------------------------------------

    def subscribe(self, *subjects: str, history: int = 0, conflation_ms: int = 0) -> Subscription:
        """Subscribe to ``subjects``; the subscribe is sent now or on the next session.

        ``history`` = last N cached messages first (type historical) instead of the
        snapshot; ``conflation_ms`` >= 100 asks for one merged message per period.
        A subject can belong to one active subscription at a time (ValueError).
        """
        self._raise_if_ended()
        if not subjects:
            raise ValueError("subscribe needs at least one subject")
        if history < 0 or conflation_ms < 0:
            raise ValueError("history and conflation_ms must be >= 0")
        unique = tuple(dict.fromkeys(validate_subject(s) for s in subjects))
        send, receive = trio.open_memory_channel[Message](self._message_buffer)
        trackers = [SubjectTracker(s, history, conflation_ms) for s in unique]
        outlet = Outlet(send)
        self._router.add(trackers, outlet)
        subscription = Subscription(
            unique, receive, outlet, self._unsubscribe, self._resume, lambda: self._error
        )
        self._subscribe_on_live(unique)
        return subscription

    def _subscribe_on_live(self, subjects: tuple[str, ...]) -> None:
        """Subscribe ``subjects`` on the open session, if any (else the next does it),
        ahead of any publish or unsubscribe made after this call."""
        live = self._live
        if live is not None and self._nursery is not None:
            live.subscribe_due()
            self._nursery.start_soon(self._send_subscribe, live, subjects)

    async def _send_subscribe(self, session: Session, subjects: tuple[str, ...]) -> None:
        try:
            requests = self._router.requests_for(session.id, subjects)
            if requests and session.is_open:
                with contextlib.suppress(ConnectionClosed):  # else the next session does it
                    await session.subscribe(requests)
        finally:
            session.subscribe_sent()

    def _resume(self, outlet: Outlet) -> None:
        """A paused subscription has room again: subscribe its subjects from their
        positions, now or on the next session."""
        if self._closed or self._error is not None:
            return
        subjects = self._router.resume(outlet)
        if subjects:
            self._subscribe_on_live(subjects)

    async def _unsubscribe(self, subscription: Subscription) -> None:
        self._router.remove(subscription.subjects)
        live = self._live
        if live is None or not live.is_open:
            return
        with contextlib.suppress(ConnectionClosed):  # then the next session leaves it out
            await live.after_subscribes()  # a subscribe of them made before goes first
            await live.send(Unsubscribe(subscription.subjects))

    # --- publish --------------------------------------------------------------

    async def publish(
        self,
        subject: str,
        content: bytes | str,
        fields: Mapping[str, str] | None = None,
        *,
        retained: bool = False,
        qos: Qos = Qos.STANDARD,
        timeout: float = 10.0,
    ) -> PublishResult:
        """Publish and wait for the server's status.

        Raises InvalidSubjectError before sending, NotConnectedError if no session came up
        within ``timeout`` (not sent), PublishOutcomeUnknown if it was sent but the status
        did not come back (connection lost or timeout). A publish the session ended before
        writing (it waited behind other writes; a drain's close, a stalled connection)
        goes out on the next session: it cannot have been published twice.
        """
        closure = f"{self._closure_prefix}-{next(self._closures)}"
        message = _message(subject, content, fields, retained, qos, closure)
        pending = PendingPublish(subject, closure)
        sent = False
        with trio.move_on_after(timeout):
            for _ in range(SEND_ATTEMPTS):
                session = await self._wait_live()
                pending = self._router.pending[closure] = PendingPublish(subject, closure)
                try:
                    await session.send(Publish(message))
                except NotSent:  # never written: on the next session (waits for one)
                    continue
                except ConnectionClosed:
                    pending.lost = "connection lost while sending"
                    pending.done.set()
                sent = True
                break
            if sent:
                await pending.done.wait()
        self._router.pending.pop(closure, None)
        if pending.result is not None:
            return pending.result
        if not sent:
            raise NotConnectedError(subject, timeout, self._last_down)
        if pending.lost is None:  # its status may still come: told as a notification
            self._router.given_up(closure)
        raise PublishOutcomeUnknown(subject, closure, pending.lost or f"no status in {timeout} s")

    async def publish_nowait(
        self,
        subject: str,
        content: bytes | str,
        fields: Mapping[str, str] | None = None,
        *,
        retained: bool = False,
        qos: Qos = Qos.STANDARD,
        timeout: float = 10.0,
    ) -> None:
        """Publish without a closure: no PUBLISH_OK; failures arrive as notifications.

        Waits up to ``timeout`` s for a session if there is none, then raises
        NotConnectedError (not sent: nothing piles up while every server is down);
        raises PublishOutcomeUnknown if the connection drops while sending."""
        message = _message(subject, content, fields, retained, qos, None)
        with trio.move_on_after(timeout):
            for _ in range(SEND_ATTEMPTS):
                session = await self._wait_live()
                try:
                    await session.send(Publish(message))
                except NotSent:  # never written: on the next session (waits for one)
                    continue
                except ConnectionClosed:
                    raise PublishOutcomeUnknown(
                        subject, "", "connection lost while sending"
                    ) from None
                return
        raise NotConnectedError(subject, timeout, self._last_down)

    # --- sessions -------------------------------------------------------------

    async def _run(self) -> None:
        """Keep a session open until the client is closed or ends with an error."""
        with self._run_scope:
            await self._keep_session_open()

    async def _keep_session_open(self) -> None:
        failed: ServerEntry | None = None
        while True:
            server = choose_server(self._servers, self._rng, avoid=failed)
            end = await self._attempt(server)
            if self._closed:
                return
            self._last_down = end.describe()
            self._notifications.put(
                Notification(
                    NotificationStatus.SERVER_DOWN, reason=end.describe(), server=server.url
                )
            )
            if end.terminal:
                self._end(ConnectionClosedError(end.code, end.reason, server.url))
                return
            failed = server
            delay = self._backoff.next_delay()
            if self._backoff.exhausted():
                self._end(ServerUnavailableError(self._backoff.failures, end.describe()))
                return
            await trio.sleep(delay)

    async def _attempt(self, server: ServerEntry) -> SessionEnd:
        try:
            connect_op = await self._connect()
        except trio.TooSlowError:
            timeout = self._policy.connect_timeout
            return SessionEnd.by_client(f"token provider gave no token within {timeout} s")
        except Exception as exc:  # the application's code: a failed attempt, retried
            return SessionEnd.by_client(f"token provider failed: {exc!r}")

        progress = WriteProgress()
        async def serve(ws: WebSocketConnection) -> SessionEnd:
            session_id = next(self._session_ids)
            session = Session(ws, server.url, session_id, self._router, self._keepalive, progress)
            return await self._session(session, connect_op)

        try:
            return await run_connection(  # progress: the bytes it writes (a write's stall)
                server.url, serve, subprotocols=[SUBPROTOCOL], max_message_size=MAX_FRAME_BYTES,
                connect_timeout=self._policy.connect_timeout, tls=self._tls, progress=progress,
            )
        except trio.TooSlowError:
            reason = f"no WebSocket connection within {self._policy.connect_timeout} s"
            return SessionEnd.by_client(f"cannot connect: {reason}")
        except (HandshakeError, OSError, trio.BrokenResourceError) as exc:
            why = describe_connect_failure(exc, server.url)
            return SessionEnd.by_client(f"cannot connect: {why}")

    async def _connect(self) -> Connect:
        """The ``connect`` operation of a new session: with a fresh token from the token
        provider when there is one (a session closed 4503 TOKEN_EXPIRED reconnects),
        asked before the connection opens. Raises what the provider raises, or
        trio.TooSlowError after ``connect_timeout`` s."""
        provider = self._token_provider
        if provider is None:
            return self._connect_op
        with trio.fail_after(self._policy.connect_timeout):
            token = provider()
            if inspect.isawaitable(token):
                token = await token
        op = self._connect_op
        return Connect(client=op.client, token=token, heartbeat_ms=op.heartbeat_ms)

    async def _session(self, session: Session, connect_op: Connect) -> SessionEnd:
        try:
            await session.handshake(connect_op, self._policy.connect_timeout)
        except ConnectionClosed as exc:
            return session.ended_by(exc)
        except (HandshakeFailed, OperationError) as exc:
            # one silent for connect_timeout will not answer the close either: the next
            # member is tried now, not after the closing handshake's CLOSE_TIMEOUT
            wait = 0.0 if isinstance(exc, HandshakeTimeout) else None
            await session.close(close_codes.PROTOCOL_ERROR.code, "expected 'connected'", wait)
            return SessionEnd.by_client(f"handshake failed: {exc}")
        requests = self._router.requests_for(session.id)
        self._set_live(session)
        self._notifications.put(Notification(NotificationStatus.SERVER_UP, server=session.server))
        end = SessionEnd.by_client("session ended")
        up_since = trio.current_time()
        try:
            end = await session.serve(requests)
        finally:
            if trio.current_time() - up_since >= self._policy.healthy_after:
                self._backoff.reset()  # else it ended soon: a failed attempt
            self._set_live(None)
            self._router.session_lost(
                f"connection to {session.server} lost: {end.describe()}",
                untaken_failed=end.untaken_not_published,
            )
        return end

    def _end(self, error: MigratoryError | None) -> None:
        if self._error is None and not self._closed:
            self._error = error
        self._router.close(self._error)
        self._set_live(None)

    async def aclose(self) -> None:
        """Close the session (code 1000) and end every subscription and waiter."""
        if self._closed:
            return
        self._closed = True
        live = self._live
        if live is not None:
            with trio.CancelScope(shield=True):
                await live.close(1000, "client closed")
        self._end(None)
        self._run_scope.cancel()


def _message(
    subject: str,
    content: bytes | str,
    fields: Mapping[str, str] | None,
    retained: bool,
    qos: Qos,
    closure: str | None,
) -> Message:
    validate_subject(subject)
    body = content.encode("utf-8") if isinstance(content, str) else bytes(content)
    fields = dict(fields or {})
    if not all(isinstance(k, str) and isinstance(v, str) for k, v in fields.items()):
        raise TypeError("fields must map str to str")
    return Message(subject, body, fields, retained, Qos(qos), closure)


@asynccontextmanager
async def connect(
    servers: Iterable[str] | str,
    *,
    token: str | None = None,
    token_provider: TokenProvider | None = None,
    name: str = "",
    reconnect: ReconnectPolicy | None = None,
    keepalive: Keepalive | None = None,
    message_buffer: int = DEFAULT_MESSAGE_BUFFER,
    rng: random.Random | None = None,
    ca_file: str | None = None,
    tls: ssl.SSLContext | None = None,
) -> AsyncIterator[Client]:
    """Open a client; sessions are opened in the background (watch SERVER_UP).

    ``servers``: ``"WEIGHT URL"`` or ``"URL"`` (weight 100). ``message_buffer``: messages
    buffered per subscription; when it is full the subscription pauses (its subjects are
    left at the server) until the application has taken half, then resumes from where the
    buffered messages end. ``wss://`` servers are verified against the system's CAs,
    or against ``ca_file`` (a PEM file) when given; ``tls`` replaces the whole context
    (client certificates for mutual TLS).
    ``token_provider`` (a function, plain or async, returning the
    entitlement token) is called for every new session instead of using ``token``: a
    session whose token expired (close 4503) reconnects with a fresh one. A provider that
    raises, or gives nothing within ``connect_timeout``, is a failed attempt: SERVER_DOWN
    with the reason, back-off, and it counts towards ``max_attempts``.
    """
    if tls is None and ca_file is not None:
        tls = _ca_context(ca_file)
    client = Client(
        parse_servers(servers),
        token=token,
        token_provider=token_provider,
        name=name,
        reconnect=reconnect or ReconnectPolicy(),
        keepalive=keepalive or Keepalive(),
        message_buffer=message_buffer,
        rng=rng or random.Random(),
        tls=tls,
    )
    try:
        async with trio.open_nursery() as nursery:
            client._nursery = nursery
            nursery.start_soon(client._run)
            try:
                yield client
            finally:
                await client.aclose()
    except BaseExceptionGroup as group:  # the application's own exception, unwrapped
        raise single_error(group) from None


def _ca_context(ca_file: str) -> ssl.SSLContext:
    """A context that trusts the PEM certificates in ``ca_file``; a file that cannot be
    read or holds no certificate is a ``ValueError`` naming it."""
    try:
        return ssl.create_default_context(cafile=ca_file)
    except ssl.SSLError as exc:  # before OSError: it is one
        raise ValueError(f"CA file {ca_file!r}: no PEM certificate in it ({exc.reason})") from None
    except OSError as exc:
        raise ValueError(f"CA file {ca_file!r}: {exc.strerror or exc}") from None
