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

The messages a cluster member's cache sync jumped over go to the subject's live
subscribers as a :class:`MissedRun` (``Hub._catch_up_live``, :func:`send_missed`): each
message encoded once per format as above, and the encoded messages joined, once for all
the subscribers, into runs of at most :data:`RUN_BYTES`, which a sink that takes them
(``deliver_run``: a session's outbox, :mod:`migratory.server.run_output`) queues with one
append each -- the same bytes in the same order as one ``deliver`` per message, which
made 10,000 subscribers and a jump of 400 messages 4,000,000 appends in one step of the
loop (docs/benchmarks.md, "A cache sync past live subscribers").
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import NamedTuple, Protocol, TypeVar, cast

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

    def deliver_formatted_run(self, missed: MissedRun) -> None:
        """``missed``'s messages, in order: one :meth:`deliver_formatted` each unless the
        format can take them joined (an SSE stream of one subject)."""
        for message, frames in zip(missed.messages, missed.frames, strict=True):
            self.deliver_formatted(message, frames)


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


T = TypeVar("T")

RUN_BYTES = 16_384
"""The most bytes of encoded messages a :class:`MissedRun` joins into one run (one with
a larger message holds that one alone). Well under the default ``MaxBatchingSpace``
(64 KiB), so that a run seldom fills a batch on its way in (``run_output``)."""


class Run(NamedTuple):
    """Consecutive encoded messages of a :class:`MissedRun`, joined."""

    joined: bytes
    frames: tuple[bytes, ...]
    """The same, one per message (``joined`` is ``b"".join(frames)``)."""
    last: Message
    """The last message it holds."""


class MissedRun:
    """Messages the live subscribers of one subject missed (oldest first), encoded once
    per wire format and joined once into runs, shared by every subscriber."""

    __slots__ = ("_runs", "_shared", "frames", "messages")

    def __init__(self, messages: Sequence[Message]) -> None:
        self.messages = messages
        # per message, what one fan-out of it shares (send_message's ``frames``)
        self.frames: list[dict[object, bytes]] = [{} for _ in messages]
        self._runs: dict[object, list[Run]] = {}
        self._shared: dict[object, object] = {}

    def shared(self, key: object, build: Callable[[], T]) -> T:
        """What ``build`` makes of the messages for a format (under ``key``): made by the
        first sink that asks, shared by the others."""
        made = self._shared.get(key)
        if made is None:
            made = self._shared[key] = build()
        return cast("T", made)

    def runs(self, key: object, encode: Callable[[Message, dict[object, bytes]], bytes],
             ) -> list[Run]:
        """The messages encoded by ``encode`` (stored under ``key`` in each message's
        ``frames``, as the per-message path does), joined into runs of at most
        :data:`RUN_BYTES`: made by the first sink that asks, shared by the others."""
        runs = self._runs.get(key)
        if runs is None:
            runs = self._runs[key] = []
            encoded: list[bytes] = []
            for message, frames in zip(self.messages, self.frames, strict=True):
                frame = frames.get(key)
                if frame is None:
                    frame = frames[key] = encode(message, frames)
                encoded.append(frame)
            start = size = 0
            for end, frame in enumerate(encoded):
                if size and size + len(frame) > RUN_BYTES:
                    runs.append(self._run(encoded, start, end))
                    start, size = end, 0
                size += len(frame)
            if encoded:
                runs.append(self._run(encoded, start, len(encoded)))
        return runs

    def _run(self, encoded: list[bytes], start: int, end: int) -> Run:
        frames = tuple(encoded[start:end])
        return Run(b"".join(frames), frames, self.messages[end - 1])


def _native_frame(message: Message, frames: dict[object, bytes]) -> bytes:
    return message_frame(message)


def tell_missed(listeners: Sequence[tuple[MessageSink, int]], missed: MissedRun) -> None:
    """``missed``'s messages to whole-message sinks, each in order, at the QoS granted to
    each: all at once to a sink that takes them so (``deliver_missed`` says True: an
    MQTT session at QoS 0 queues runs of the PUBLISHes, encoded once for every session;
    at QoS 1 it keeps them in a backlog sent in its own turns, ``mqtt_backlog``);
    to the others one message at a time, each message to all of them in turn (as a live
    fan-out: the PUBLISH shared by the sessions is the message's; sink by sink, each
    session encoded every message again)."""
    rest = []
    for sink, qos in listeners:
        deliver_missed: Callable[[MissedRun, int], bool] | None = getattr(
            sink, "deliver_missed", None)
        if deliver_missed is None or not deliver_missed(missed, qos):
            rest.append((sink, qos))
    if rest:
        for message in missed.messages:
            for sink, qos in rest:
                sink.deliver_message(message, qos)


def send_missed(sink: AnySink, missed: MissedRun) -> None:
    """``missed``'s messages to one subscriber, in its wire format, in order: what one
    :func:`send_message` per message would give it, in as few appends as it can take."""
    if isinstance(sink, FormatSink):
        sink.deliver_formatted_run(missed)
        return
    deliver_run: Callable[[bytes, tuple[bytes, ...]], None] | None = getattr(
        sink, "deliver_run", None)
    for run in missed.runs(Sink, _native_frame):
        if deliver_run is not None:
            deliver_run(run.joined, run.frames)
        else:  # a sink that takes one frame at a time
            for frame in run.frames:
                sink.deliver(frame)
