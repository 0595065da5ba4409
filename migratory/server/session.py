"""One client connection's protocol logic, without I/O.

Bytes from the socket go into :meth:`Session.receive_data`; everything to write ends up
in :attr:`Session.outbox`, already framed. The trio adapter (``migratory.server.connection``)
only moves bytes and obeys :attr:`Session.closing` / :attr:`Session.aborted`.

Phases: HTTP requests on h11 (``http_front``: keep-alive, ``/publish``, ``/snapshot``,
monitoring) → a WebSocket (``connect`` → connected) or a Server-Sent Events stream
(``sse_stream``) → closing; the connection's ``Listener`` says which it may do.
"""

from __future__ import annotations

import itertools
import logging
import random
from collections.abc import Set as AbstractSet
from typing import Any

from migratory import client_lines
from migratory.entitlement_decisions import (
    ClientIdentity,
    DecisionPending,
    connect_refusal,
    deferred_decisions,
)
from migratory.listeners import OPEN_LISTENER, Listener
from migratory.model.message import Message
from migratory.model.outbox import Outbox, SlowConsumer
from migratory.protocol import close_codes, ops, sse
from migratory.protocol import websocket as ws
from migratory.protocol.http import MQTT_SUBPROTOCOL, Request, handshake_response, wants_mqtt
from migratory.server import admission
from migratory.server.context import ServerContext
from migratory.server.format_sink import op_frame
from migratory.server.http_front import HttpFront
from migratory.server.publish_rules import check_publish
from migratory.server.session_link import Link
from migratory.server.session_stream import RECONNECT_JITTER_MS, RECONNECT_MS, StreamSession
from migratory.server.session_subscriptions import SLICE_UNITS, Subscriptions
from migratory.server.sse_stream import SseStream

log = logging.getLogger("migratory.session")

_connection_ids = itertools.count(1)  # names a connection in logs and audit events


def new_connection_id() -> int:
    return next(_connection_ids)  # one client connection's (any front end)


class Session(StreamSession):
    __slots__ = (
        "_ctx", "_decoder", "_held_close", "_held_event", "_http", "_in_flight", "_link",
        "_publish_rate", "_stream", "_subscriptions", "aborted", "close_code", "close_reason",
        "closing", "connection_id", "decision_pending", "expires_at", "heartbeat_slot", "identity",
        "listener", "mqtt_upgrade", "outbox", "peer",
    )

    def __init__(
        self, ctx: ServerContext, link: Link, peer: str, listener: Listener = OPEN_LISTENER
    ) -> None:
        self._ctx = ctx
        self._link = link
        self.peer = peer
        self.listener = listener
        config = ctx.config
        self.outbox = Outbox(
            batch_space=config.max_batching_space, max_pending=config.client_max_pending_bytes,
            budget=ctx.outbox_budget,
        )
        self._http: HttpFront | None = HttpFront(self, ctx, listener)
        self._decoder: ws.FrameDecoder | None = None
        self._stream: SseStream | None = None
        self.identity: ClientIdentity | None = None
        # a WebSocket upgrade chose subprotocol ``mqtt``: the bytes after the request,
        # for the MQTT session that takes over the connection (connection.py)
        self.mqtt_upgrade: bytes | None = None
        self._subscriptions = Subscriptions(self, ctx)
        self.closing = False  # write what is queued, then close
        self.aborted = False  # close now, drop what is queued
        self.close_code: int | None = None
        self.close_reason = ""
        self._in_flight = 0  # publishes submitted with a closure, their status not queued
        self._held_close: tuple[int, str] | None = None  # a close waiting for those statuses
        self.connection_id = new_connection_id()
        self._publish_rate: admission.PublishRate | None = None  # made at its first publish
        self.expires_at: float | None = None  # the token's exp (Entitlement = Token)
        self.decision_pending: DecisionPending | None = None  # Custom: waited for outside
        self._held_event: ws.Event | None = None  # taken again once that is decided
        self.work_done = 0  # operations processed so far, as counted against a budget
        self.heartbeat_slot: Any = None  # heartbeats.py: the SessionsDue it waits in, or None

    @property
    def subjects(self) -> AbstractSet[str]:  # the subjects this client is subscribed to
        return self._subscriptions.subjects

    @property
    def connected(self) -> bool:
        return self.identity is not None

    @property
    def is_websocket(self) -> bool:
        """A client session the server may close (drain, rebalance, shutdown): a WebSocket
        or an SSE stream (a ``close`` event), as ``MqttSession.is_websocket``; not HTTP."""
        return self._decoder is not None or self._stream is not None

    @property
    def is_stream(self) -> bool:  # a Server-Sent Events stream
        return self._stream is not None

    @property
    def in_http(self) -> bool:  # still reading HTTP requests (no WebSocket or stream yet)
        return self._http is not None

    @property
    def awaiting_answer(self) -> bool:  # an HTTP request waits for its answer (a publish)
        return self._http is not None and self._http.awaiting_answer

    @property
    def requests_answered(self) -> int:
        return 0 if self._http is None else self._http.requests

    @property
    def frontend(self) -> str:  # the front end it speaks, as GET /metrics labels it
        stream = "sse" if self._stream is not None else "http"
        return "websocket" if self._decoder is not None else stream

    # --- fan-out (hot path) ---------------------------------------------------

    def deliver(self, frame: bytes) -> None:
        if self.closing or self.aborted:
            return
        try:
            full = self.outbox.enqueue(frame)
        except SlowConsumer as exc:
            self._slow_consumer(exc)
            return
        if full:
            self._link.flush_now()
        else:
            self._link.mark_dirty()

    def cut_off(self, why: str) -> None:
        """Close at once, dropping what is queued: a client that does not read."""
        self._ctx.stats.slow_consumers += 1
        client_lines.lines.log(log, logging.WARNING, "slow consumer",
                               "%s: slow consumer cut off (%s)", self.describe(), why)
        self.connection_lost()
        self.aborted = True
        self._link.flush_now()

    def _slow_consumer(self, why: SlowConsumer | str) -> None:
        """Drop what is queued, try to say 4500, and let the transport close."""
        if self.closing or self.aborted:
            return
        self._ctx.stats.slow_consumers += 1
        self.close_reason = "slow consumer"
        client_lines.lines.log(log, logging.WARNING, "slow consumer", "%s: slow consumer "
                               "cut off (%s)", self.describe(), why, extra=self.log_fields())
        # a stream cut in its catch-up keeps what it queued (<= the limit: the marks of
        # its ids moved only with what was queued) for the browser to resume after it
        # (dropped, the same resume came back and was cut forever)
        kept = self.catching_up
        self.connection_lost()
        if not kept:
            self.outbox.discard(keep_first=self._link.writing)
        self.close_code = close_codes.SLOW_CONSUMER.code
        self._send_last_word(self.close_code, "slow consumer", position=kept)
        self.closing = True
        self._link.flush_now()

    # --- input ----------------------------------------------------------------

    def receive_data(self, data: bytes, now: float, *, budget: int | None = None) -> bool:
        """Take bytes from the socket and process them (about ``budget`` operations). True
        when more is waiting: call :meth:`process` again on a later turn, before reading."""
        if self.closing or self.aborted:
            return False
        if self._http is not None:
            self._http.receive(data, now)  # may start a WebSocket (start_websocket)
        elif self._decoder is not None:
            self._decoder.receive_data(data)
        # an SSE stream reads nothing more from its client
        return self.process(now, budget)

    @property
    def buffered_bytes(self) -> int:
        """Bytes held for incomplete WebSocket frames or messages, or for the body of an
        HTTP request (``POST /publish``) not complete yet."""
        decoder, http = self._decoder, self._http
        return decoder.buffered if decoder is not None else 0 if http is None else http.buffered

    def process(self, now: float, budget: int | None = None) -> bool:
        """Handle the WebSocket operations already received, at most about ``budget`` of
        them (an answer by its messages: ``answer_units``; ``work_done``). True when more is
        waiting -- or when an entitlement decision is (``decision_pending``: the caller
        waits for it without holding the loop; the operation is taken again after)."""
        if self._decoder is None and self._http is not None and self.decision_pending is None:
            self._http.resume(now)  # a request held for an entitlement decision, if any
        decoder = self._decoder  # (that request may have been an upgrade)
        if decoder is None or self.decision_pending is not None:
            return self.decision_pending is not None
        done = 0
        try:
            with deferred_decisions():
                while not (self.closing or self.aborted):
                    if budget is not None and done >= budget:
                        return True
                    if self._subscriptions.waiting:
                        if budget is not None and done and done + SLICE_UNITS > budget:
                            return True  # (an answer's work is known once done: at most)
                        done += self._subscriptions.answer_next(now)
                        continue
                    event = self._held_event = self._held_event or decoder.next_event()
                    if event is None:
                        return False
                    done += 1
                    self._on_event(event, now)  # kept in _held_event if a decision is pending
                    self._held_event = None
        except DecisionPending as pending:
            self.decision_pending = pending
            return True
        except ws.RemoteProtocolError as exc:
            self._protocol_error("frame")
            self.close(exc.code, exc.reason)
        except ops.OperationError as exc:
            self._protocol_error("operation")
            self.close(exc.close.code, exc.reason)
        finally:
            self.work_done += done
        return False

    # --- leaving HTTP (called by http_front) -------------------------------------------

    def start_websocket(self, request: Request, trailing: bytes, now: float) -> None:
        """Answer the upgrade and read WebSocket frames from then on (or, offered
        subprotocol ``mqtt``, leave the connection to an MQTT session: connection.py)."""
        self._http = None
        if wants_mqtt(request):
            self._send_unbounded(handshake_response(request, subprotocol=MQTT_SUBPROTOCOL))
            self.mqtt_upgrade = trailing
            return
        config = self._ctx.config
        self._decoder = ws.FrameDecoder(
            client_frames=True,
            max_message_size=config.max_frame_size,
            max_fragments=config.max_fragments_per_message,
        )
        self._send_unbounded(handshake_response(request))
        if trailing:
            self._decoder.receive_data(trailing)  # processed by receive_data, bounded

    def start_stream(
        self,
        identity: ClientIdentity,
        subjects: list[str],
        requests: list[ops.SubscriptionRequest | str],
        headers: tuple[tuple[str, str], ...],
        now: float,
    ) -> None:
        """Become a Server-Sent Events stream of ``subjects`` (http_front checked them)."""
        self._http = None
        self.identity = identity
        self.expires_at = self._ctx.entitlement.expiry(identity)  # closed 4503 then
        self._ctx.stats.sessions_opened += 1
        retry = RECONNECT_MS + random.randrange(RECONNECT_JITTER_MS)
        asked = [r.position if isinstance(r, ops.SubscriptionRequest) else None for r in requests]
        resumed_from = asked if any(p is not None for p in asked) else None
        self._send_unbounded(sse.stream_head(headers) + sse.retry(retry, resumed_from))
        stream = self._stream = SseStream(self, subjects)
        self._ctx.stats.subscriptions_open += len(subjects)  # (MaxSubscriptions) until stop
        stream.start(self._ctx.hub, requests, now)
        self.flush()  # the head; the writer refills the events in its turns of the loop

    def reply_and_close(self, response: bytes) -> None:  # an HTTP response, then close
        self._send_unbounded(response)
        self.closing = True
        self.flush()

    def send_unbounded(self, data: bytes) -> None:
        self._send_unbounded(data)

    def _on_event(self, event: ws.Event, now: float) -> None:
        if isinstance(event, ws.BinaryMessage):
            self._on_operation(ops.decode_client_op(event.data), now)
        elif isinstance(event, ws.Ping):
            self._send(ws.encode_pong(event.payload))
        elif isinstance(event, ws.CloseReceived):
            code = event.code if event.code is not None else close_codes.NORMAL.code
            if code in (1005, 1006, 1015):
                code = close_codes.NORMAL.code
            self.close(code, "")
        elif isinstance(event, ws.TextMessage):
            self.close(close_codes.UNSUPPORTED_DATA.code, "text frames are not supported")

    # --- operations -------------------------------------------------------------

    def _on_operation(self, op: ops.ClientOp, now: float) -> None:
        if isinstance(op, ops.Connect):
            self._on_connect(op)
            return
        if self.identity is None:
            raise ops.OperationError(close_codes.NOT_CONNECTED, "send 'connect' first")
        if isinstance(op, ops.Publish):
            self._on_publish(op.message, now)
        elif isinstance(op, ops.Subscribe):
            self._subscriptions.take(op.subscriptions)
        elif isinstance(op, ops.Unsubscribe):
            self._subscriptions.unsubscribe(op.subjects)
        elif isinstance(op, ops.Ping):
            self.send_op(ops.Pong(op.id))

    def _on_connect(self, op: ops.Connect) -> None:
        if self.identity is not None:
            raise ops.OperationError(close_codes.NOT_CONNECTED, "already connected")
        not_ready = self._ctx.readiness()
        if not_ready is not None:
            self.close(close_codes.TRY_AGAIN_LATER.code, not_ready)
            return
        identity = ClientIdentity(name=op.client[:200], token=op.token, peer=self.peer)
        audit, entitlement = self._ctx.audit, self._ctx.entitlement
        if not entitlement.allow_connect(identity):
            self._ctx.stats.count(self._ctx.stats.entitlement_denials, "connect")
            if audit is not None and audit.access:
                audit.event("access", "connect", self.audit_client_as(identity), outcome="denied")
            code, why = connect_refusal(entitlement, identity)  # 4503, 4504, or 4003
            self.close(code.code, why)
            return
        self.identity = identity
        self.expires_at = entitlement.expiry(identity)
        self._ctx.stats.sessions_opened += 1
        if audit is not None and audit.access:
            audit.event("access", "connect", self.audit_client(), outcome="allowed")
        log.debug("%s: connected", self.describe(), extra=self.log_fields())
        config, beats = self._ctx.config, self._ctx.heartbeats  # (heartbeats.py: if asked)
        # a newer client gets this server's (lower) version: only its ops (SERVER_OPS_BY_VERSION)
        beat = None if beats is None else beats.start(self, op.heartbeat_ms)
        self.send_op(ops.Connected(config.server_name, min(op.version, ops.PROTOCOL_VERSION),
                                   max_subjects_per_subscribe=config.max_subjects_per_subscribe,
                                   heartbeat_ms=beat))

    def _on_publish(self, message: Message, now: float) -> None:
        assert self.identity is not None
        ctx = self._ctx
        status, reason = check_publish(ctx, self.listener, self.identity, message)
        ctx.stats.publishes_received += 1  # (after: a DecisionPending takes it again)
        if self._publish_rate is None:  # (most clients never publish: 80 bytes each, idle)
            self._publish_rate = admission.PublishRate(ctx.config.max_publishes_per_second, now)
        if status is None and not self._publish_rate.take(now):
            limit = ctx.config.max_publishes_per_second
            status, reason = ops.Status.PUBLISH_FAILED, f"over MaxPublishesPerSecond ({limit})"
        audit = ctx.audit
        if audit is not None and audit.message:
            audit.event("message", "publish", self.audit_client(), subject=message.subject,
                        size=message.size(), retained=message.retained,
                        closure=message.closure,
                        outcome="submitted" if status is None else status.name, reason=reason)
        if status is not None:
            ctx.stats.publishes_refused += 1
            if status is ops.Status.PUBLISH_DENIED:
                ctx.stats.count(ctx.stats.entitlement_denials, "publish")
            self.send_op(ops.PublishStatus(status, message.closure, message.subject, None, reason))
            return
        if message.closure is None:
            ctx.publishing.submit(message, None, now)
            return
        self._in_flight += 1  # exactly one publish_result / publish_ok comes back
        ctx.publishing.submit(message, self, now)

    # --- output ---------------------------------------------------------------

    def publish_result(self, status: ops.PublishStatus) -> None:
        """Queue the outcome of a publish; the publish path flushes (see ``flush``)."""
        self._publish_status(ws.encode_binary(ops.encode_server_op(status)))

    def publish_ok(self, closure: str | None, subject: str, epoch: int, seq: int) -> None:
        """A ``PUBLISH_OK`` (PublishReply), its frame encoded straight from the fields."""
        self._publish_status(ws.encode_binary(ops.encode_publish_ok(closure, subject, epoch, seq)))

    @property
    def answer(self) -> ws.FrameDecoder | None:  # closing: reads the peer's close frame
        return self._decoder if self.closing and not self.aborted else None

    @property
    def settling(self) -> bool:
        """Closing, the close frame held until the publishes in flight have their status."""
        return self._held_close is not None and not self.aborted

    def _publish_status(self, frame: bytes) -> None:
        """A publish's status, queued even if a close waits for it (a publish, garbage in
        one segment: answered, then the close frame after the last)."""
        self._in_flight -= 1
        if not self.settling:
            self._send(frame)
            return
        self._send_unbounded(frame)
        if self._in_flight <= 0:
            code, reason = self._held_close  # type: ignore[misc]
            self._held_close = None
            self._send_last_word(code, reason)

    def flush(self) -> None:
        self._link.flush_now()

    def send_op(self, op: ops.ServerOp) -> None:
        self._send(self._ctx.hub.recovery.frame(op, op_frame))

    def _send(self, frame: bytes) -> None:
        if self.closing or self.aborted:
            return
        try:
            self.outbox.enqueue(frame)
        except SlowConsumer as exc:
            self._slow_consumer(exc)

    def close(self, code: int, reason: str) -> None:
        """Queue a close frame; the transport closes once it is written."""
        if self.closing or self.aborted:
            return
        self.close_code = code
        self.close_reason = self.close_reason or reason
        if code not in (close_codes.NORMAL.code, close_codes.GOING_AWAY.code):
            self._ctx.stats.closed(code)
            client_lines.closing(log, self.describe(), code, reason, self.log_fields())
        self.connection_lost()
        held = self._in_flight > 0 and code != close_codes.SLOW_CONSUMER.code
        if held and self._decoder is not None:  # after the statuses of its publishes
            self._held_close = (code, reason)
        else:
            self._send_last_word(code, reason)
        if self._decoder is not None and self._decoder.buffered:
            self._decoder.discard()  # free what it held; else it reads on: ``answer``
        self.closing = True

    def _send_last_word(self, code: int, reason: str, *, position: bool = True) -> None:
        """The close frame of a WebSocket, the ``close`` event of a stream (no id if not
        ``position``: events were dropped), an HTTP error response before either (503 for
        1013 TRY_AGAIN_LATER: a request body over IncompleteFrameBudget)."""
        if self._decoder is not None:
            self._send_unbounded(ws.encode_close(code, reason))
        elif self._stream is not None:
            self._send_unbounded(self._stream.close_event(code, reason, with_id=position))
        elif self._http is not None:
            self._send_unbounded(self._http.refusal(code, reason))
            self._http = None  # nothing more is read: free the body it held

    def _send_unbounded(self, frame: bytes) -> None:
        """Queue a frame the session must send whatever the outbox limit (replies, closes)."""
        self.outbox.enqueue_unbounded(frame)

    def release(self) -> None:
        """The connection is gone: free the buffers now (the session and its connection
        refer to each other: only a full garbage collection would free them)."""
        if self._decoder is not None:
            self._decoder.discard()
        self.outbox.discard()

    def connection_lost(self) -> None:  # forget every subscription (idempotent)
        self._subscriptions.forget()
        if self._stream is not None:
            self._ctx.stats.subscriptions_open -= self._stream.stop(self._ctx.hub)

    def finished(self) -> None:
        """The connection is over: audit the disconnect of a connected client."""
        self.connection_lost()
        audit = self._ctx.audit
        if audit is not None and audit.access and self.identity is not None:
            reason = self.close_reason or ("" if self.close_code else "connection lost")
            audit.event("access", "disconnect", self.audit_client(), code=self.close_code,
                        reason=reason)

    def describe(self) -> str:
        """How log lines name this client: name, address and connection id."""
        name = self.identity.name if self.identity is not None else ""
        return f"client {name or '-'}@{self.peer} #{self.connection_id}"

    def log_fields(self) -> dict[str, Any]:
        """The client as fields of a log record (JSON log lines show them)."""
        name = self.identity.name if self.identity is not None else None
        return {"client": name, "peer": self.peer, "connection_id": self.connection_id}

    def audit_client(self) -> dict[str, Any]:
        return self.audit_client_as(self.identity)

    def audit_client_as(self, identity: ClientIdentity | None) -> dict[str, Any]:
        """This connection under ``identity`` (an HTTP request carries its own)."""
        return {
            "name": None if identity is None else identity.name,
            "peer": self.peer,
            "connection_id": self.connection_id,
        }
