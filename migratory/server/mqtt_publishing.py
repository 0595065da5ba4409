"""An MQTT connection's publishes (PUBLISH, its PUBACK, the will), without I/O: part
of :class:`~migratory.server.mqtt_session.MqttSession`, in its own module as
:mod:`migratory.server.mqtt_saving` and :mod:`migratory.server.mqtt_takeover` are.

A PUBLISH takes the server's publish path: a QoS 1 PUBACK waits for ``PUBLISH_OK`` (in a
Guaranteed cluster, a majority of seeds); a refused publish closes the connection (MQTT
3.1.1 has no negative acknowledgement)."""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from migratory import client_lines
from migratory.entitlement_decisions import ClientIdentity
from migratory.listeners import Listener
from migratory.model.message import Message, Qos
from migratory.model.topic import InvalidTopicError, topic_to_subject
from migratory.protocol import close_codes, mqtt, mqtt_encode, ops
from migratory.protocol import websocket as ws
from migratory.server.admission import PublishRate
from migratory.server.context import publish_ok_status
from migratory.server.drain import REFUSED as SENT_ELSEWHERE
from migratory.server.mqtt_store import SESSION_CLOSURE
from migratory.server.mqtt_takeover import MqttTakeover
from migratory.server.publish_rules import check_publish

if TYPE_CHECKING:
    from migratory.server.context import ServerContext

log = logging.getLogger("migratory.mqtt")


class MqttPublishing(MqttTakeover):
    __slots__ = ("_acks_due", "_held_close", "_publish_rate")
    _ctx: ServerContext
    _acks_due: int  # QoS 1 publishes whose outcome has not come back yet
    _held_close: tuple[int, str] | None  # a close waiting for those outcomes
    _publish_rate: PublishRate | None
    identity: ClientIdentity | None
    listener: Listener
    websocket: bool

    @property
    def settling(self) -> bool:
        raise NotImplementedError

    def close(self, code: int, reason: str) -> None:
        raise NotImplementedError

    def _denied(self, action: str) -> None:
        raise NotImplementedError

    def _wrap(self, packet: bytes) -> bytes:
        raise NotImplementedError

    def _send_raw(self, frame: bytes) -> None:
        raise NotImplementedError

    # --- publishing -----------------------------------------------------------

    def _on_publish(self, packet: mqtt.Publish, now: float) -> None:
        assert self.identity is not None
        ctx = self._ctx
        ctx.stats.publishes_received += 1
        try:
            subject = topic_to_subject(packet.topic)
        except InvalidTopicError as exc:
            self._refused_publish(str(exc))
            return
        message = Message(subject, packet.payload, retained=packet.retain,
                          qos=Qos.GUARANTEED if packet.qos else Qos.STANDARD,
                          closure=None if packet.packet_id is None else str(packet.packet_id))
        status, reason = check_publish(ctx, self.listener, self.identity, message)
        if self._publish_rate is None:  # (most devices only subscribe: ~80 bytes each, idle)
            self._publish_rate = PublishRate(ctx.config.max_publishes_per_second, now)
        if status is None and not self._publish_rate.take(now):
            status = ops.Status.PUBLISH_FAILED
            reason = f"MaxPublishesPerSecond ({ctx.config.max_publishes_per_second}) exceeded"
        if status is not None:
            if status is ops.Status.PUBLISH_DENIED:
                self._denied("publish")
            self._refused_publish(f"{status.value}: {reason}")
            return
        if packet.qos:
            self._acks_due += 1  # exactly one publish_result / publish_ok comes back
        ctx.publishing.submit(message, self if packet.qos else None, now)

    def _refused_publish(self, reason: str) -> None:
        self._ctx.stats.publishes_refused += 1
        self._refused(f"publish refused: {reason}")

    def _refused(self, reason: str) -> None:
        """MQTT 3.1.1 has no negative acknowledgement: a refused operation closes."""
        client_lines.lines.log(log, logging.INFO, "mqtt refused", "%s: %s: closing",
                               self.describe(), reason, extra=self.log_fields())
        self.close(close_codes.BAD_OPERATION.code, reason)

    def publish_ok(self, closure: str | None, subject: str, epoch: int, seq: int) -> None:
        self.publish_result(publish_ok_status(closure, subject, epoch, seq))

    def publish_result(self, status: ops.PublishStatus) -> None:
        """The outcome of a QoS 1 publish, or of saving the session record."""
        if status.closure == SESSION_CLOSURE:
            self._saved(status)
            return
        self._acks_due -= 1
        if self.aborted:
            return
        if self.settling:  # closing: its PUBACKs go first, then the close held back
            if status.status is ops.Status.PUBLISH_OK and status.closure is not None:
                self._send_raw(self._wrap(mqtt_encode.encode_packet(
                    mqtt.Puback(int(status.closure)))))
            if self._acks_due <= 0:
                code, reason = self._held_close  # type: ignore[misc]
                self._held_close = None
                if self.websocket:
                    self._send_raw(ws.encode_close(code, reason[:120]))
            return
        if status.status is ops.Status.PUBLISH_OK and status.closure is not None:
            self._send(mqtt_encode.encode_packet(mqtt.Puback(int(status.closure))))
        elif status.reason == SENT_ELSEWHERE:
            # the member drains or moves this client: not published, no PUBACK (the
            # client publishes it again where it goes); the drain closes the connection
            # (4502, no will) once the earlier publishes have their PUBACK
            pass
        elif not self.closing:
            self._refused_publish(f"{status.status.value}: {status.reason or ''}")

    def _publish_will(self, will: mqtt.Will) -> None:
        assert self.identity is not None
        subject = topic_to_subject(will.topic)  # checked at CONNECT
        message = Message(subject, will.payload, retained=will.retain,
                          qos=Qos.GUARANTEED if will.qos else Qos.STANDARD)
        status, reason = check_publish(self._ctx, self.listener, self.identity, message)
        if status is not None:
            log.info("%s: will on %r refused (%s: %s): dropped", self.describe(), will.topic,
                     status.value, reason, extra=self.log_fields())
            return
        self._ctx.publishing.submit(message, None, self._now)
        self._ctx.stats.mqtt_wills_published += 1
