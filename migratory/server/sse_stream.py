"""One Server-Sent Events stream: a hub subscriber writing ``text/event-stream``.

The stream is a :class:`~migratory.server.format_sink.FormatSink`: a message's
``event``/``data`` lines are encoded once per fan-out and shared by every
stream; each stream ends the event with its own ``id`` -- the positions of all
its subjects (see :mod:`migratory.protocol.sse`). Bytes go through the session's
outbox, so batching and the slow-consumer cut-off are the WebSocket ones.
"""

from __future__ import annotations

from typing import Protocol

from migratory.model.message import Message, MessageType
from migratory.model.position import Position
from migratory.protocol import ops, sse
from migratory.server.format_sink import FormatSink
from migratory.server.hub import Hub

SSE_FORMAT = "sse"  # this format's key in a fan-out's shared frames: event + data lines
SSE_SINGLE = "sse-one-subject"  # the whole event of one-subject streams (id included)
# Types that move a subject's position forward (a snapshot or history does not).
_ADVANCING = frozenset({MessageType.UPDATE, MessageType.RECOVERED})
_STATUS_EVENTS = {
    ops.Status.SUBSCRIBE_ALLOW: "subscribe",
    ops.Status.SUBSCRIBE_DENY: "deny",
    ops.Status.DATA_SYNC: "sync",
    ops.Status.DATA_RESYNC: "resync",
}

_RESUME_OUTCOMES = {ops.Status.DATA_SYNC: "sync", ops.Status.DATA_RESYNC: "resync"}


class Output(Protocol):
    """Where the stream writes (the session): bounded, and unbounded for the last word;
    ``closing`` or ``aborted`` once it takes nothing more (a slow consumer cut off)."""

    closing: bool
    aborted: bool

    def deliver(self, frame: bytes) -> None: ...

    def send_unbounded(self, data: bytes) -> None: ...


class SseStream(FormatSink):
    __slots__ = ("_index", "_marks", "_output", "_single", "subjects")

    def __init__(self, output: Output, subjects: list[str]) -> None:
        self._output = output
        self.subjects = subjects
        self._index = {subject: i for i, subject in enumerate(subjects)}
        self._single = len(subjects) == 1
        # each subject's position, or the last message that moved it: a fan-out stores
        # the message it shares rather than build a Position per stream (that cost SSE
        # ~2 us per delivery, benchmarks/frontend_cpu.py)
        self._marks: list[Position | Message | None] = [None] * len(subjects)

    @property
    def positions(self) -> list[Position | None]:
        """Every subject's position, in the URL's order (None: none yet)."""
        return [m.position if isinstance(m, Message) else m for m in self._marks]

    # --- MessageSink (the hub) ---------------------------------------------------

    def deliver_formatted(self, message: Message, frames: dict[object, bytes]) -> None:
        # the hub gives a stream messages of its own subjects only. Live: an event the
        # output refuses cuts the stream off with what waits dropped, and its close event
        # names no position (close_event), so the marks may run ahead here
        if self._single and message.type in _ADVANCING:
            self._marks[0] = message  # the id is the message's position: the whole event
            event = frames.get(SSE_SINGLE)  # is the same for every one-subject stream
            if event is None:
                event = frames[SSE_SINGLE] = self._lines(message, frames) + sse.event_id(
                    (message,)
                )
            self._output.deliver(event)
            return
        self._advance(message)
        self._output.deliver(self._lines(message, frames) + sse.event_id(self._marks))

    @staticmethod
    def _lines(message: Message, frames: dict[object, bytes]) -> bytes:
        lines = frames.get(SSE_FORMAT)
        if lines is None:
            lines = frames[SSE_FORMAT] = sse.message_lines(message)
        return lines

    def deliver_op(self, op: ops.ServerOp) -> None:
        """A resume's events and the statuses. A mark moves only once the output took its
        event: cut off during a resume, the stream sends what it took, then a close event
        whose id the browser resumes from, which must claim nothing it did not get."""
        if isinstance(op, ops.Deliver):
            output = self._output
            for message in op.messages:
                if output.closing or output.aborted:
                    return  # cut off (the resume passed ClientMaxPendingBytes): encode no more
                index = self._index.get(message.subject) if message.type in _ADVANCING else None
                self._deliver_marked(sse.message_lines(message), index, message)
        elif isinstance(op, ops.SubjectStatus):
            name = _STATUS_EVENTS.get(op.status)
            if name is None:
                return
            index = self._index.get(op.subject) if op.position is not None else None
            payload: dict[str, object] = {"subject": op.subject}
            if op.position is not None:
                payload.update(epoch=op.position.epoch, seq=op.position.seq)
            if op.reason:
                payload["reason"] = op.reason
            self._deliver_marked(sse.event(name, payload), index, op.position)

    def _deliver_marked(
        self, lines: bytes, index: int | None, mark: Position | Message | None
    ) -> None:
        """``lines`` and the id with ``mark`` at ``index`` (None: the marks as they are);
        the mark kept only if the output took the event."""
        output = self._output
        if index is None:
            output.deliver(lines + sse.event_id(self._marks))
            return
        marks = self._marks
        before = marks[index]
        marks[index] = mark
        event = lines + sse.event_id(marks)
        marks[index] = before  # until taken: a refusal's close event must not name it
        output.deliver(event)
        if not (output.closing or output.aborted):
            marks[index] = mark

    def _advance(self, message: Message) -> None:
        if message.type in _ADVANCING:
            index = self._index.get(message.subject)
            if index is not None:
                self._marks[index] = message

    # --- the session ---------------------------------------------------------------

    def start(
        self, hub: Hub, requests: list[ops.SubscriptionRequest | str], now: float
    ) -> list[str]:
        """Subscribe every subject in order; a ``str`` is a subject refused with that
        reason (SUBSCRIBE_DENY). Returns the outcome of each subject resumed from a
        position (``Last-Event-ID``): ``sync`` or ``resync``, for the statistics."""
        # every subject's position first, kept until the hub says more: the events of
        # the first subjects' resume carry the later ones' positions in their ids, so a
        # stream cut halfway through its resume resumes the rest from where they were.
        # An unreadable Last-Event-ID comes as epoch 0 (unknown: snapshot and resync),
        # kept as ``0:0`` too: cut halfway, the rest resync again instead of starting
        # afresh without a resync event
        for index, request in enumerate(requests):
            position = None if isinstance(request, str) else request.position
            if position is not None:
                self._marks[index] = position
        resumed: list[str] = []
        output = self._output
        for subject, request in zip(self.subjects, requests, strict=True):
            if output.closing or output.aborted:
                break  # cut off as a slow consumer: the client resumes the rest from its id
            if isinstance(request, str):
                denied = ops.SubjectStatus(ops.Status.SUBSCRIBE_DENY, subject, None, request)
                self.deliver_op(denied)
                continue
            for op in hub.subscribe(self, request, now):
                if request.position is not None and isinstance(op, ops.SubjectStatus):
                    outcome = _RESUME_OUTCOMES.get(op.status)
                    if outcome is not None:
                        resumed.append(outcome)
                self.deliver_op(op)
        return resumed

    def stop(self, hub: Hub) -> None:
        for subject in self.subjects:
            hub.unsubscribe(self, subject)

    def close_event(self, code: int, reason: str, *, with_id: bool = True) -> bytes:
        """The last event of a stream the server ends. ``with_id`` False when events that
        were queued for the client were dropped (a live slow consumer): no ``id`` line,
        so the browser keeps the id of the last event it got whole."""
        event = sse.event("close", {"code": code, "reason": reason})
        return event + (sse.event_id(self._marks) if with_id else b"\n")
