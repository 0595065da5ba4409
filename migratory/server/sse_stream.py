"""One Server-Sent Events stream: a hub subscriber writing ``text/event-stream``.

The stream is a :class:`~migratory.server.format_sink.FormatSink`: a message's
``event``/``data`` lines are encoded once per fan-out and shared by every
stream; each stream ends the event with its own ``id`` -- the positions of all
its subjects (see :mod:`migratory.protocol.sse`). Bytes go through the session's
outbox, so batching and the slow-consumer cut-off are the WebSocket ones.

Catch-up is paced by the socket: what the hub answers a subscribe with (the snapshot,
or a resume's recovered messages and its ``sync``/``resync``) waits in the stream's
backlog and is encoded only as the socket drains (:meth:`SseStream.refill`, called by
the writer whenever the outbox has room); the subjects of the URL are subscribed one by
one as the backlog empties, so a stream holds the answer of one subject at a time. Live
messages that arrive meanwhile wait behind the backlog, and only they count against
``ClientMaxPendingBytes`` (with what the outbox holds): a reader that keeps reading
catches up however far behind it resumed, one that stops is cut off by the live
messages it does not take (or, with none, by :meth:`SseStream.stalled`). A resume
answered whole, as it used to be, passed the limit at once when it was larger: cut,
retried 1-2 s later from a little further, cut again -- behind a stream of 420 msg/s,
forever (chaos ``--sse-subscribers``, docs/chaos.md).

A subject resumed from a position is answered in slices of at most ``SLICE_MESSAGES``
recovered messages (:mod:`~migratory.server.hub_resume`, as a WebSocket's), and a refill
does at most a ``budget`` of work (:attr:`SseStream.work_done`, counted as a WebSocket's
answers are: ``answer_units``): the connection's writer refills in its turns of the
event loop (:mod:`~migratory.server.loop_turns`), so a herd of streams reconnecting with
their ``Last-Event-ID`` is caught up a bounded amount per turn, the others served between.
"""

from __future__ import annotations

from collections import deque
from typing import Protocol, TypeAlias

from migratory.model.message import Message, MessageType
from migratory.model.position import Position
from migratory.protocol import ops, sse
from migratory.server.admission import WORK_UNIT_BYTES
from migratory.server.format_sink import FormatSink, MissedRun
from migratory.server.hub import Hub, ResumeCursor
from migratory.server.session_subscriptions import (
    MESSAGES_PER_UNIT,
    SLICE_MESSAGES,
    SLICE_UNITS,
    SettledResume,
    answer_units,
)

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
ID_BYTES_PER_SUBJECT = 24  # what a live event held is counted for its id, per subject

# What waits in a backlog: a message the hub answered with (encoded when it is sent), a
# status, or a live message that came meanwhile with its shared lines (counted bytes)
Waiting: TypeAlias = Message | ops.SubjectStatus | tuple[Message, bytes]


class Output(Protocol):
    """Where the stream writes (the session): bounded, and unbounded for the last word;
    ``closing`` or ``aborted`` once it takes nothing more (a slow consumer cut off)."""

    closing: bool
    aborted: bool

    def deliver(self, frame: bytes) -> None:
        """A live event (written at the next batch, or at once when a batch is full)."""

    def deliver_run(self, run: bytes, frames: tuple[bytes, ...]) -> None:
        """Live events, joined as ``run``: as ``deliver`` of each (``run_output``)."""

    def queue(self, frame: bytes) -> None:
        """An event of the backlog (the writer that asked for it writes it)."""

    def send_unbounded(self, data: bytes) -> None: ...

    def backlog_grew(self, held: int) -> None:
        """The backlog grew: ``held`` bytes of live events wait in it, counted against
        the client's limit with what the output holds (past it: a slow consumer)."""

    def resumed(self, outcome: str) -> None:
        """A subject resumed from a position: ``sync`` or ``resync`` (statistics)."""


class SseStream(FormatSink):
    __slots__ = (
        "_backlog", "_held", "_hub", "_idle", "_index", "_marks", "_now", "_output",
        "_pending_seen", "_progress", "_progress_seen", "_single", "_stopped", "_unsubscribed",
        "subjects", "work_done",
    )

    def __init__(self, output: Output, subjects: list[str]) -> None:
        self._output = output
        # the events still to send before live ones (None: caught up, the usual case)
        self._backlog: deque[Waiting] | None = None
        self._held = 0  # bytes counted for the live events in the backlog
        # the URL's subjects not subscribed yet, subscribed as the backlog empties (a
        # resume under way first, as its cursor)
        self._unsubscribed: deque[
            tuple[str, ops.SubscriptionRequest | str | ResumeCursor | SettledResume]] = deque()
        self._hub: Hub | None = None
        self._now = 0.0  # when the stream started (a stream's subscriptions conflate none)
        self._progress = self._progress_seen = 0  # refills that sent something
        self._pending_seen = 0  # the output's bytes waiting, at the last stalled()
        self._idle = 0  # stalled() calls in a row with no progress
        self._stopped = False
        self.work_done = 0  # units of work of the refills so far (answer_units' scale)
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
        backlog = self._backlog
        if backlog is not None:  # catching up: after the backlog, counted
            lines = self._lines(message, frames)
            backlog.append((message, lines))
            self._held += len(lines) + ID_BYTES_PER_SUBJECT * len(self.subjects)
            self._output.backlog_grew(self._held)
            return
        if self._single and message.type in _ADVANCING:
            self._marks[0] = message  # the id is the message's position: the whole event
            event = frames.get(SSE_SINGLE)  # is the same for every one-subject stream
            if event is None:
                event = frames[SSE_SINGLE] = self._single_event(message, frames)
            self._output.deliver(event)
            return
        self._advance(message)
        self._output.deliver(self._lines(message, frames) + sse.event_id(self._marks))

    def deliver_formatted_run(self, missed: MissedRun) -> None:
        # a stream of one subject, live: the events are the same for every such stream,
        # joined once (the marks move with each run, as with each event above). Any
        # other: each event has the stream's own id -- they wait in its backlog, as a
        # resume's recovered messages do (the cache bounds them; only live events behind
        # them count against ClientMaxPendingBytes: counted, a jump of 100 kB cut a
        # stream that was keeping up), encoded as the socket drains in the writer's turns
        # of the loop -- not every event of every stream in the hub's step
        if self._backlog is None and self._single and missed.shared(
                _ADVANCING, lambda: all(m.type in _ADVANCING for m in missed.messages)):
            for run in missed.runs(SSE_SINGLE, self._single_event):
                self._marks[0] = run.last
                self._output.deliver_run(run.joined, run.frames)
            return
        if self._backlog is None:
            self._backlog = deque()
        self._backlog.extend(missed.messages)  # (as a resume's: not counted as held)
        self._output.backlog_grew(self._held)

    @classmethod
    def _single_event(cls, message: Message, frames: dict[object, bytes]) -> bytes:
        """The whole event of ``message`` for a stream of one subject."""
        return cls._lines(message, frames) + sse.event_id((message,))

    @staticmethod
    def _lines(message: Message, frames: dict[object, bytes]) -> bytes:
        lines = frames.get(SSE_FORMAT)
        if lines is None:
            lines = frames[SSE_FORMAT] = sse.message_lines(message)
        return lines

    def deliver_op(self, op: ops.ServerOp) -> None:
        """A subscribe's answer (recovered messages, statuses): after what waits, sent as
        the socket drains. A status outside a catch-up goes out at once."""
        if isinstance(op, ops.Deliver):
            if self._backlog is None:
                self._backlog = deque()
            self._backlog.extend(op.messages)
        elif isinstance(op, ops.SubjectStatus) and op.status in _STATUS_EVENTS:
            if self._backlog is None:
                self._send_status(op, queued=False)
                return
            self._backlog.append(op)
        else:
            return
        self._output.backlog_grew(self._held)

    @property
    def catching_up(self) -> bool:
        """Events or subjects wait to be sent (:meth:`refill`)."""
        return self._backlog is not None or bool(self._unsubscribed)

    def refill(self, room: int, budget: int | None = None) -> bool:
        """Send about ``room`` bytes of the backlog (subscribing the next subjects as it
        empties, a resume a slice at a time), about ``budget`` units of work at most
        (:attr:`work_done`); True while more waits. A mark moves only once the output
        took its event: cut off meanwhile, the stream's close event names what it took."""
        output = self._output
        sent = events = 0
        units = 1  # (as a WebSocket's answer counts one, and its messages)
        while sent < room and not (output.closing or output.aborted):
            if budget is not None and units + events // MESSAGES_PER_UNIT >= budget:
                break
            backlog = self._backlog
            if backlog:
                sent += self._send(backlog.popleft())
                events += 1
            elif self._unsubscribed:
                if budget is not None and (
                        units + events // MESSAGES_PER_UNIT + SLICE_UNITS > budget):
                    break  # a step starts no answer that could pass its budget
                units += self._subscribe_next()
            else:
                self._backlog = None
                break
        if sent:
            self._progress += 1
        self.work_done += units + events // MESSAGES_PER_UNIT + sent // WORK_UNIT_BYTES
        return self.catching_up

    def stalled(self, pending: int) -> bool:
        """Catching up, and nothing moved for two calls in a row (heartbeat intervals):
        no refill sent anything and the output's ``pending`` bytes did not go down (the
        socket took none). A reader that stopped, holding its backlog: cut it off. (Two:
        a slow reader sees the socket writable only once the kernel's buffer is half
        empty, tens of seconds apart at tens of kB/s.) Nothing ``pending``: the socket took
        all, the server owes the next refill -- the stream waits for its turn of the loop
        (loop_turns.py) behind a herd catching up, never the reader's fault."""
        moved = self._progress != self._progress_seen or pending < self._pending_seen
        self._progress_seen, self._pending_seen = self._progress, pending
        if moved or not pending or not self.catching_up:
            self._idle = 0
            return False
        self._idle += 1
        return self._idle >= 2

    def _subscribe_next(self) -> int:
        """Subscribe the next subject, or answer the next slice of its resume; the work
        it counts for (``answer_units``)."""
        subject, request = self._unsubscribed.popleft()
        if isinstance(request, str):
            denied = ops.SubjectStatus(ops.Status.SUBSCRIBE_DENY, subject, None, request)
            self._queue_status(denied)
            return 1
        hub = self._hub
        assert hub is not None
        if self._backlog is None:
            self._backlog = deque()  # its answer waits there, statuses too
        if isinstance(request, ResumeCursor):
            answer, cursor = hub.continue_resume(self, request, self._now, SLICE_MESSAGES)
            resumed = True
        elif isinstance(request, SettledResume):
            answer, cursor, _ = hub.settle_resume(self, subject, self._now, SLICE_MESSAGES)
            resumed = True
        else:
            answer, cursor = hub.start_resume(self, request, self._now, SLICE_MESSAGES)
            resumed = request.position is not None
        if cursor is not None:  # the rest of its resume, before the next subject
            self._unsubscribed.appendleft((subject, cursor))
        for op in answer:
            if resumed and isinstance(op, ops.SubjectStatus):
                outcome = _RESUME_OUTCOMES.get(op.status)
                if outcome is not None:
                    self._output.resumed(outcome)
            self.deliver_op(op)
        return answer_units(answer)

    def resume_settled(self, subject: str) -> None:
        """The hub settled this stream's resume of ``subject`` (it waited for this member
        to catch up, hub_settle.py): answered as the socket drains, a slice at a time, in
        the writer's turns of the loop -- not by the hub, every waiting client at once."""
        self._unsubscribed.append((subject, SettledResume(subject)))
        self._output.backlog_grew(self._held)

    def _queue_status(self, op: ops.SubjectStatus) -> None:
        if self._backlog is None:
            self._backlog = deque()
        self._backlog.append(op)

    def _send(self, item: Waiting) -> int:
        """One event of the backlog to the output; its bytes."""
        if isinstance(item, ops.SubjectStatus):
            return self._send_status(item, queued=True)
        if isinstance(item, tuple):
            message, lines = item
            self._held -= len(lines) + ID_BYTES_PER_SUBJECT * len(self.subjects)
        else:
            message, lines = item, sse.message_lines(item)
        index = self._index.get(message.subject) if message.type in _ADVANCING else None
        return self._deliver_marked(lines, index, message, queued=True)

    def _send_status(self, op: ops.SubjectStatus, *, queued: bool) -> int:
        index = self._index.get(op.subject) if op.position is not None else None
        payload: dict[str, object] = {"subject": op.subject}
        if op.position is not None:
            payload.update(epoch=op.position.epoch, seq=op.position.seq)
        if op.reason:
            payload["reason"] = op.reason
        name = _STATUS_EVENTS[op.status]
        return self._deliver_marked(sse.event(name, payload), index, op.position, queued=queued)

    def _deliver_marked(
        self, lines: bytes, index: int | None, mark: Position | Message | None, *,
        queued: bool,
    ) -> int:
        """``lines`` and the id with ``mark`` at ``index`` (None: the marks as they are);
        the mark kept only if the output took the event. The event's bytes."""
        output = self._output
        write = output.queue if queued else output.deliver
        if index is None:
            event = lines + sse.event_id(self._marks)
            write(event)
            return len(event)
        marks = self._marks
        before = marks[index]
        marks[index] = mark
        event = lines + sse.event_id(marks)
        marks[index] = before  # until taken: a refusal's close event must not name it
        write(event)
        if not (output.closing or output.aborted):
            marks[index] = mark
        return len(event)

    def _advance(self, message: Message) -> None:
        if message.type in _ADVANCING:
            index = self._index.get(message.subject)
            if index is not None:
                self._marks[index] = message

    # --- the session ---------------------------------------------------------------

    def start(
        self, hub: Hub, requests: list[ops.SubscriptionRequest | str], now: float
    ) -> None:
        """Take the subscriptions, in the URL's order; a ``str`` is a subject refused
        with that reason (SUBSCRIBE_DENY). Each subject is subscribed when the backlog
        before it is sent (:meth:`refill`); resumes are told to the output (resumed)."""
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
        self._hub, self._now = hub, now
        self._unsubscribed.extend(zip(self.subjects, requests, strict=True))

    def stop(self, hub: Hub) -> int:
        """Unsubscribe, and drop what waits (the close event names what was sent); the
        subjects let go (none the second time: they count in MaxSubscriptions)."""
        self._backlog = None
        self._held = 0
        self._unsubscribed.clear()
        if self._stopped:
            return 0
        self._stopped = True
        for subject in self.subjects:
            hub.unsubscribe(self, subject)
        return len(self.subjects)

    def close_event(self, code: int, reason: str, *, with_id: bool = True) -> bytes:
        """The last event of a stream the server ends. ``with_id`` False when events that
        were queued for the client were dropped (a live slow consumer): no ``id`` line,
        so the browser keeps the id of the last event it got whole."""
        event = sse.event("close", {"code": code, "reason": reason})
        return event + (sse.event_id(self._marks) if with_id else b"\n")
