"""The QoS 0 PUBLISH of the message being fanned out, encoded once for every MQTT
subscriber (and once more wrapped in a WebSocket frame for MQTT over WebSocket): the
hub hands the same message object to every session in turn."""

from __future__ import annotations

from migratory.model.message import Message
from migratory.protocol import mqtt_encode
from migratory.protocol import websocket as ws


class SharedFrames:
    """The QoS 0 frame of the message being fanned out, encoded once for every session."""

    __slots__ = ("_subject", "_subject_topic", "message", "plain", "topic_field", "wrapped")

    def __init__(self) -> None:
        self.message: Message | None = None
        self.topic_field = b""
        self.plain = b""
        self.wrapped = b""
        self._subject = ""
        self._subject_topic = b""

    def topic_of(self, subject: str) -> bytes:
        """The topic field of ``subject``, encoded once for the deliveries of it in a row
        (a QoS 1 PUBLISH: its packet identifier makes the rest its own). Before, a QoS 1
        delivery took it from :meth:`topic`, which encodes the message's QoS 0 frame as
        well: a session sending a cache sync's jump (mqtt_backlog), each message once,
        encoded each one's topic and an unused QoS 0 frame, ~40 % of its work."""
        if subject != self._subject:
            self._subject = subject
            self._subject_topic = mqtt_encode.publish_parts(subject[1:], b"")[0]
        return self._subject_topic

    def topic(self, message: Message) -> bytes:
        if self.message is not message:
            self.message = message
            self.topic_field = mqtt_encode.publish_parts(message.subject[1:], b"")[0]
            self.plain = mqtt_encode.encode_publish_from_parts(
                self.topic_field, message.content, qos=0, retain=False, packet_id=None
            )
            self.wrapped = b""
        return self.topic_field

    def qos0(self, message: Message, websocket: bool) -> bytes:
        self.topic(message)
        if not websocket:
            return self.plain
        if not self.wrapped:
            self.wrapped = ws.encode_binary(self.plain)
        return self.wrapped


SHARED = SharedFrames()
