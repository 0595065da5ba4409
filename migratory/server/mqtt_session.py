"""One MQTT 3.1.1 client's protocol logic, without I/O (see docs/mqtt.md).

Bytes go into :meth:`MqttSession.receive_data`; what to write ends up in
:attr:`MqttSession.outbox` (wrapped in binary WebSocket frames with
``websocket=True``). The trio adapter moves bytes, runs the keep-alive timer and obeys
``closing`` / ``aborted``. Publishes take the server's publish path: a QoS 1 PUBACK
waits for ``PUBLISH_OK`` (in a Guaranteed cluster, a majority of seeds); a refused
publish closes the connection (MQTT 3.1.1 has no negative acknowledgement:
:mod:`migratory.server.mqtt_publishing`). The hub
hands subscribers whole messages; a QoS 0 PUBLISH is encoded once for all of them.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

from migratory import client_lines
from migratory.entitlement_decisions import ClientIdentity, DecisionPending, connect_refusal
from migratory.listeners import OPEN_LISTENER, Listener
from migratory.model.message import Message
from migratory.model.outbox import Outbox, SlowConsumer
from migratory.model.position import Position
from migratory.model.topic import InvalidTopicError, topic_to_subject
from migratory.protocol import close_codes, mqtt, mqtt_encode
from migratory.protocol import websocket as ws
from migratory.server.admission import PublishRate
from migratory.server.mqtt_connect import Refusal, check_connect
from migratory.server.mqtt_delivery import PRUNE_FROM
from migratory.server.mqtt_expiry import max_sessions_refusal
from migratory.server.mqtt_inflight import Inflight, inflight_limit
from migratory.server.mqtt_publishing import MqttPublishing
from migratory.server.mqtt_store import SessionRecord, session_subject, take_up
from migratory.server.mqtt_subscriptions import Subscriptions
from migratory.server.session import new_connection_id

if TYPE_CHECKING:
    from migratory.server.context import ServerContext
    from migratory.server.session_link import Link

log = logging.getLogger("migratory.mqtt")

KEEP_ALIVE_EXPIRED = "keep-alive expired"  # (counted as MQTT_KEEP_ALIVE, not as 4501)
# closes that send a healthy client elsewhere (shutdown, drain, rebalance): no will
_MOVED = frozenset({close_codes.GOING_AWAY.code, close_codes.DRAINED.code})


class MqttSession(MqttPublishing):
    """One MQTT connection: CONNECT, publishes, subscriptions, keep-alive, will."""

    # slots: the fan-out reads a few of them for every delivery (a smaller object, and
    # no instance dict: benchmarks/mqtt_fanout_cpu.py)
    __slots__ = (
        "_ctx", "_decoder", "_frames", "_inflight", "_link", "_lost",
        "_reached", "_registry", "_suback", "_will", "aborted", "client_id",
        "close_code", "closing", "connection_id", "expires_at", "identity", "keep_alive",
        "listener", "outbox", "peer", "persistent", "subscriptions", "websocket",
    )

    def __init__(
        self,
        ctx: ServerContext,
        link: Link,
        peer: str,
        registry: dict[str, MqttSession],
        listener: Listener = OPEN_LISTENER,
        *,
        websocket: bool = False,
    ) -> None:
        self._ctx = ctx
        self.listener = listener  # its role: may this connection publish?
        self._link = link
        self.peer = peer
        self._registry = registry
        self.websocket = websocket
        config = ctx.config
        self.outbox = Outbox(
            batch_space=config.max_batching_space, max_pending=config.client_max_pending_bytes,
            budget=ctx.outbox_budget,
        )
        self._decoder = mqtt.MqttDecoder(server=True, max_packet_size=config.max_frame_size,
                                         max_filters=config.max_subjects_per_subscribe)
        self._frames = (
            ws.FrameDecoder(client_frames=True, max_message_size=config.max_frame_size,
                            max_fragments=config.max_fragments_per_message)
            if websocket else None
        )
        self.identity: ClientIdentity | None = None
        self.decision_pending: DecisionPending | None = None  # Custom: waited for outside
        self.work_done = 0
        self._held_packet: mqtt.Packet | None = None  # handled once that is decided
        self._connect_checked: tuple[str, ClientIdentity] | None = None
        self._barrier = None  # a CONNECT's read barrier (mqtt_input)
        self._barrier_until = 0.0
        self._barrier_passed = False
        self.client_id = ""
        self.keep_alive = 0
        self.persistent = False
        self._will: mqtt.Will | None = None
        self.subscriptions = Subscriptions(self, ctx)
        self._publish_rate: PublishRate | None = None  # made at its first publish
        self._reached = self.subscriptions.reached
        # the subject of the last delivery and the message (or Position) it reached: its
        # entry in _reached is stale while it is here (see settle_reached)
        self._hot_subject: str | None = None
        self._hot: Position | Message | None = None
        self._forget_at = PRUNE_FROM  # (settle_reached)
        self._max_positions = config.mqtt_session_max_subjects
        self._prune_at = min(PRUNE_FROM, self._max_positions)
        self._live_meanwhile: set[str] | None = None  # (watch_live)
        self._backlog = None  # a cache sync's jump at QoS 1 (mqtt_backlog)
        self._inflight = Inflight(  # unacknowledged QoS 1 deliveries
            inflight_limit(config.client_max_pending_bytes), ctx.outbox_budget)
        self._acks_due = 0  # QoS 1 publishes submitted, their outcome not come back
        self._held_close: tuple[int, str] | None = None  # a close waiting for those
        self._takeover_token, self._takeover_key = "", None  # (mqtt_takeover: CONNECT told)
        self._takeover_armed = False
        self._record: SessionRecord | None = None  # persistent sessions only
        self._saving = False
        self._save_again = False
        self._urgent = False  # a change to save now: filters, take-up, the connection's end
        self._next_save = 0.0  # clock() before which a change of positions alone waits
        self._waiting_subacks, self._subacks_saving = [], 0  # sent once the record is saved
        self._discarding = None  # a clean CONNECT's CONNACK waits for its discard
        self._now = 0.0
        self._work = 0  # subjects the last packet scanned (mqtt_input.SCAN_UNIT)
        self._suback = b""  # of the SUBSCRIBE whose retained messages are being sent
        self._lost = False
        self.closing = False
        self.aborted = False
        self.close_code: int | None = None
        self.connection_id = new_connection_id()
        self.expires_at: float | None = None  # the token's exp (Entitlement = Token)

    # --- what the connection and the server ask -------------------------------

    @property
    def connected(self) -> bool:
        return self.identity is not None

    @property
    def is_websocket(self) -> bool:  # a client session the server may close (drain...)
        return True

    @property
    def frontend(self) -> str:  # the front end it speaks, as GET /metrics labels it
        return "mqtt"

    def describe(self) -> str:  # how log lines name it: client id, address, connection
        return f"mqtt client {self.client_id or '-'}@{self.peer} #{self.connection_id}"

    def log_fields(self) -> dict[str, Any]:
        """The client as fields of a log record (JSON log lines show them)."""
        return {"client": self.client_id or None, "peer": self.peer,
                "connection_id": self.connection_id}

    def flush(self) -> None:
        self._link.flush_now()

    catching_up = False  # (an SSE stream's catch-up: session.py; refill: mqtt_delivery)

    # --- input ----------------------------------------------------------------

    def _on_packet(self, packet: mqtt.Packet, now: float) -> None:
        if isinstance(packet, mqtt.Connect):
            self._on_connect(packet, now)
        elif isinstance(packet, mqtt.Publish):
            self._on_publish(packet, now)
        elif isinstance(packet, mqtt.Puback):
            self._on_puback(packet.packet_id)
        elif isinstance(packet, mqtt.Subscribe):
            self._on_subscribe(packet, now)
        elif isinstance(packet, mqtt.Unsubscribe):
            if self.too_many_filters(packet):
                return
            self.subscriptions.remove(packet.filters)
            self._send(mqtt_encode.encode_packet(mqtt.Unsuback(packet.packet_id)))
            self._changed()
        elif isinstance(packet, mqtt.Pingreq):
            self._send(mqtt_encode.PINGRESP_BYTES)
        elif isinstance(packet, mqtt.Disconnect):
            self._will = None  # a clean disconnect: the will is discarded
            self.close(close_codes.NORMAL.code, "")

    # --- CONNECT --------------------------------------------------------------

    def _refuse(self, code: int, why: str,
                closed: close_codes.CloseCode = close_codes.CONNECT_DENIED) -> None:
        """CONNACK ``code`` (MQTT 3.1.1 has no "retry later": a token not valid yet gets
        5 as any refused one); ``closed`` is the session's close code (metrics, logs)."""
        client_lines.lines.log(log, logging.INFO, f"mqtt connack {code}", "%s: CONNECT "
                               "refused (%d): %s", self.describe(), code, why,
                               extra=self.log_fields())
        self._send(mqtt_encode.encode_packet(mqtt.Connack(False, code)))
        self.close(closed.code, why)

    def _barrier_refused(self, packet: mqtt.Connect, why: str) -> None:
        self.client_id = packet.client_id
        self._refuse(mqtt.REFUSED_SERVER_UNAVAILABLE, why)

    def _on_connect(self, packet: mqtt.Connect, now: float) -> None:
        if not self._read_barrier_passed(packet):
            return
        if packet.will is not None:
            try:
                topic_to_subject(packet.will.topic)
            except InvalidTopicError as exc:
                self._protocol_error(f"will: {exc}")
                return
        checked = self._connect_checked or check_connect(packet, self.peer, self._ctx.readiness)
        self._connect_checked = None
        if isinstance(checked, Refusal):
            self.client_id = packet.client_id
            self._refuse(checked.code, checked.reason)
            return
        client_id, identity = checked
        self.client_id = client_id
        if not self._ctx.entitlement.allow_connect(identity):
            self._denied("connect")
            closed, why = connect_refusal(self._ctx.entitlement, identity)  # 4503, 4504, 4003
            self._refuse(mqtt.REFUSED_NOT_AUTHORIZED, why, closed)
            return
        snapshot = self._ctx.hub.snapshot(session_subject(client_id))
        over = None if packet.clean_session else max_sessions_refusal(
            self._ctx, self._registry, client_id, snapshot)
        if over is not None:
            self._refuse(over.code, over.reason)
            return
        live = self._take_over(client_id)
        self.identity = identity
        self.expires_at = self._ctx.entitlement.expiry(identity)  # closed then (app.py)
        self.keep_alive = packet.keep_alive
        self._will = packet.will
        self.persistent = not packet.clean_session
        if not self.persistent:  # a stored session of its id is discarded: held no more
            self._ctx.hub.release_session_filters(client_id)
        self._ctx.stats.sessions_opened += 1
        self._ctx.stats.mqtt_sessions_opened += 1
        config = self._ctx.config
        taken = take_up(snapshot, client_id, persistent=self.persistent, live=live,
                        expiry=config.mqtt_session_expiry,
                        max_subjects=config.mqtt_session_max_subjects,
                        standard=bool(config.cluster_members)
                        and config.cluster_delivery_mode == "Standard")
        self._record, stored = taken.record, taken.stored
        if packet.client_id:  # (a made-up id is no other connection's: mqtt_takeover)
            self._publish_takeover(client_id, now, taken)
        if taken.expired:
            self._ctx.stats.mqtt_sessions_expired += 1
            log.info("%s: stored session not connected for more than MqttSessionExpiry: "
                     "discarded", self.describe(), extra=self.log_fields())
        present = self.persistent and stored is not None
        connack = mqtt_encode.encode_packet(mqtt.Connack(present, 0))
        if taken.discard is not None:
            self.discard_then_connack(taken.discard, connack, now)
            return
        self._send(connack)
        if self.persistent and stored is not None:
            self.subscriptions.resume(stored, now)  # caught up in slices (mqtt_input)
            self._ctx.stats.mqtt_sessions_resumed += 1
            self._changed()  # this connection's generation holds the session now
        elif taken.expired and self._record is not None:
            self._changed()  # the fresh (empty) record replaces the expired one at once

    def _take_over(self, client_id: str) -> SessionRecord | None:
        """A client id connects once per server: the older connection is closed. Returns
        its persistent session's record, which it saves no more (this one takes it up:
        a save of it still in flight must not land after this connection's own)."""
        older = self._registry.get(client_id)
        live = None
        if older is not None and older is not self:
            older.taken_over("by a new connection")
            live, older._record = older._record, None
            older._save_again = False  # (what its saves still carry: live.saving)
        self._registry[client_id] = self
        return live

    # --- subscribing ----------------------------------------------------------

    def _on_subscribe(self, packet: mqtt.Subscribe, now: float) -> None:
        assert self.identity is not None
        if self.too_many_filters(packet):  # bound, then work
            return
        codes = tuple(self.subscriptions.add(f, qos, self.identity, now)
                      for f, qos in packet.requests)
        if self._record is not None:  # (which subjects its bound must keep: exact filters)
            self._record.filters = self.subscriptions.filters()
        self.subscriptions.start_retained()  # one scan for all the wildcards, in slices
        self._suback = mqtt_encode.encode_packet(mqtt.Suback(packet.packet_id, codes))
        if not self.subscriptions.retaining:
            self._subscribed()

    def _caught_up(self) -> None:
        """Slices over (mqtt_input): a SUBSCRIBE's SUBACK, or a resume's save."""
        if not self._suback:
            self._changed()
            return
        self._subscribed()

    def _subscribed(self) -> None:
        suback, self._suback = self._suback, b""
        if self._record is None:
            self._send(suback)
            return
        self._waiting_subacks.append(suback)  # the subscription survives a failover first
        self._changed()

    def entitlement_allows_subscribe(self, subject: str) -> bool:
        assert self.identity is not None
        allowed = self._ctx.entitlement.allow_subscribe(self.identity, subject)
        if not allowed:
            self._denied("subscribe")
        return allowed

    def _denied(self, action: str) -> None:
        """An entitlement refusal, for GET /metrics (migratory_entitlement_denials_total)."""
        stats = self._ctx.stats
        stats.count(stats.entitlement_denials, action)

    # --- output ---------------------------------------------------------------

    def _wrap(self, packet: bytes) -> bytes:
        return ws.encode_binary(packet) if self.websocket else packet

    def _deliver(self, frame: bytes) -> bool:
        """Queue ``frame``; False when the client was cut off as a slow consumer."""
        try:
            full = self.outbox.enqueue(frame)
        except SlowConsumer as exc:
            self._slow_consumer(str(exc))
            return False
        if full:
            self._link.flush_now()
        else:
            self._link.mark_dirty()
        return True

    def _send(self, packet: bytes) -> None:
        """A reply (CONNACK, PUBACK, SUBACK, PINGRESP...), bounded as deliveries are: a
        client that sends requests without reading the replies is a slow consumer (queued
        without bound, 20 MB of PINGREQ not read left 14 MB in its outbox, RSS +55 MB)."""
        self._send_frame(self._wrap(packet))

    def _send_frame(self, frame: bytes) -> None:
        """A reply already framed (over WebSocket, a pong too), bounded (see _send)."""
        if self.closing or self.aborted:
            return
        try:
            self.outbox.enqueue(frame)
        except SlowConsumer as exc:
            self._slow_consumer(f"replies not read: {exc}")

    def _send_raw(self, frame: bytes) -> None:
        self.outbox.enqueue_unbounded(frame)

    def _slow_consumer(self, why: str) -> None:
        if self.closing or self.aborted:
            return
        self._ctx.stats.slow_consumers += 1
        client_lines.lines.log(log, logging.WARNING, "slow consumer", "%s: slow consumer "
                               "cut off (%s)", self.describe(), why, extra=self.log_fields())
        self.outbox.discard(keep_first=self._link.writing)
        self.close(close_codes.SLOW_CONSUMER.code, "slow consumer")
        self._link.flush_now()

    def release(self) -> None:
        """The connection is gone: what it queued and its unacknowledged deliveries leave
        the OutboxMemoryBudget."""
        self.outbox.discard()
        self._inflight.release()

    def keep_alive_expired(self) -> None:
        client_lines.lines.log(log, logging.INFO, "mqtt keep-alive", "%s: nothing received "
                               "for 1.5 x keep-alive %d s", self.describe(), self.keep_alive,
                               extra=self.log_fields())
        self.close(close_codes.CONNECT_TIMEOUT.code, KEEP_ALIVE_EXPIRED)

    def close(self, code: int, reason: str) -> None:
        """Close the network connection once what is queued is written (MQTT 3.1.1 has
        no server DISCONNECT); over WebSocket a close frame goes first."""
        if self.closing or self.aborted:
            return
        if code not in (close_codes.NORMAL.code, close_codes.GOING_AWAY.code):
            self._ctx.stats.closed("MQTT_KEEP_ALIVE" if reason == KEEP_ALIVE_EXPIRED else code)
        self.close_code = code
        if code in _MOVED:
            self._will = None  # the client is fine: it is sent to another member
        self.connection_lost()
        if self._acks_due > 0 and code != close_codes.SLOW_CONSUMER.code:
            self._held_close = (code, reason)  # a valid PUBLISH before garbage: its PUBACK
        elif self.websocket:
            self._send_raw(ws.encode_close(code, reason[:120]))
        self.closing = True

    @property
    def settling(self) -> bool:
        """Closing once its QoS 1 publishes in flight have their outcome (connection.py
        waits for it before it closes)."""
        return self._held_close is not None and not self.aborted

    @property
    def answer(self) -> ws.FrameDecoder | None:  # over WebSocket: reads the close answer
        return self._frames if self.closing and not self.aborted else None

    def connection_lost(self) -> None:
        """Idempotent: forget the subscriptions, publish the will, save the positions."""
        if self.identity is None or self._lost:
            return
        self._lost = True
        self.subscriptions.detach()
        if self._registry.get(self.client_id) is self:
            del self._registry[self.client_id]
        will, self._will = self._will, None
        if will is not None:
            self._publish_will(will)
        if self._record is not None:
            self._changed()
