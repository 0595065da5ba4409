"""The hub's kinds of subscriber: native sessions (:class:`Sink`), subscribers with
their own wire format that subscribe like native sessions, and whole-message sinks.

A :class:`FormatSink` (a Server-Sent Events stream) gets the native
subscribe semantics from the hub -- snapshot, resume from a position with
recovered messages then DATA_SYNC, or the snapshot and DATA_RESYNC, waiting
while a cluster member lags -- but in its own encoding. It gets each message
with ``frames`` (:meth:`FormatSink.deliver_formatted`), a dict that lives for
one fan-out: the first sink of a format encodes the message and stores it under
its format's key, the others reuse it (encode once per format). Statuses come
through :meth:`FormatSink.deliver_op`.

(MQTT sessions are the hub's other kind of whole-message subscriber,
:class:`MessageSink`: they keep their own resume logic and take the message with
the QoS granted.)
"""

from __future__ import annotations

from typing import Protocol

from migratory.model.message import Message
from migratory.model.position import Position
from migratory.protocol import ops
from migratory.protocol.websocket import encode_binary


class Sink(Protocol):
    """A native session: pre-encoded WebSocket frames."""

    def deliver(self, frame: bytes) -> None: ...


class FormatSink:
    __slots__ = ()

    def deliver_formatted(self, message: Message, frames: dict[object, bytes]) -> None:
        raise NotImplementedError

    def deliver_op(self, op: ops.ServerOp) -> None:
        raise NotImplementedError


AnySink = Sink | FormatSink


class MessageSink(Protocol):
    """A subscriber that encodes messages itself (an MQTT session): the hub hands it the
    message once, at the highest QoS granted to the subscriptions that match it."""

    def deliver_message(self, message: Message, qos: int) -> None: ...

    def resync(self, subject: str, position: Position, snapshot: Message | None,
               qos: int) -> None:
        """``subject`` jumped to ``position`` past what the hub can tell this sink (a
        cluster member's cache sync moved it further than its cache reaches): what a
        native subscriber gets as the snapshot and ``DATA_RESYNC``."""


def message_frame(message: Message) -> bytes:
    """One message as a complete server WebSocket frame."""
    return encode_binary(ops.encode_message(message))


def op_frame(op: ops.ServerOp) -> bytes:
    """One status or batch as a complete server WebSocket frame."""
    return encode_binary(ops.encode_server_op(op))


def send_op(sink: AnySink, op: ops.ServerOp) -> None:
    """One status or batch to one subscriber, in its wire format."""
    if isinstance(sink, FormatSink):
        sink.deliver_op(op)
    else:
        sink.deliver(op_frame(op))


def send_message(sink: AnySink, message: Message, frames: dict[object, bytes]) -> None:
    """One message to one subscriber, in its wire format (``frames``: see above)."""
    if isinstance(sink, FormatSink):
        sink.deliver_formatted(message, frames)
        return
    frame = frames.get(Sink)
    if frame is None:
        frame = frames[Sink] = message_frame(message)
    sink.deliver(frame)
