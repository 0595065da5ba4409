"""A resume's recovery, whole or in slices. A mixin of :class:`~migratory.server.hub.Hub`.

A native client resuming a subject from a position gets its ``SUBSCRIBE_ALLOW``, the
messages after that position from the cache (type recovered), then ``DATA_SYNC`` -- or,
when the cache cannot tell them, the snapshot and ``DATA_RESYNC``. Done whole, one
resume of 1,000 missed messages is ~4 ms of the event loop; a herd of clients resuming
from their own positions (the subscribers of many subjects moving to this member when
theirs died) was seconds of it without a pause (docs/benchmarks.md, "A herd of resumes
from different positions").

In slices (:meth:`SlicedResumes.start_resume`, :meth:`SlicedResumes.continue_resume`):
each call recovers at most ``limit`` messages and, until the last, leaves a
:class:`ResumeCursor` -- the checkpoint, the position the client has reached. The client
is not subscribed meanwhile: a message published between two slices is cached and
recovered by a later slice, in order. The slice that reaches the subject's position
subscribes the client and says ``DATA_SYNC`` in the same call: no live message before a
recovered one, none missed, none twice. Progress is certain: the slices go up to the
position the subject had when the resume started (``target``); past it, the rest --
what was published meanwhile, bounded by the cache -- is recovered at once. A checkpoint
the cache no longer reaches, or of a lineage the subject left, ends the resume with the
snapshot and ``DATA_RESYNC``, as a resume from it would.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, NamedTuple

from migratory.model.cache import CachedRun
from migratory.model.message import Message, MessageType
from migratory.model.position import Position
from migratory.protocol import ops
from migratory.server.answer_bound import MESSAGE_OVERHEAD
from migratory.server.format_sink import AnySink
from migratory.server.history_frame import HISTORY_SLICE, HistoryFrame, SlicedHistory
from migratory.server.resume_snapshot import GONE, snapshot_as_of
from migratory.server.shared_recovery import BatchKey, SharedRecovery
from migratory.server.subject_state import SubjectState, WaitingResume


def history_op(run: CachedRun, sliced: bool) -> ops.Deliver | None:
    """The ``Deliver`` of a history (its messages typed historical), None if empty; a
    :class:`SlicedHistory` if ``sliced`` and longer than ``HISTORY_SLICE``."""
    if not len(run):
        return None
    if sliced and len(run) > HISTORY_SLICE:
        bound = run.bytes() + len(run) * MESSAGE_OVERHEAD + FRAME_OVERHEAD
        return SlicedHistory(HistoryFrame(run, bound))
    return ops.Deliver(tuple(run.as_type(0, len(run), MessageType.HISTORICAL)))


FRAME_OVERHEAD = 32
"""A history frame's bytes beyond its messages': the WebSocket header, the batch's keys
and array header."""


class ResumeCursor(NamedTuple):
    """A resume between two slices."""

    subject: str
    since: Position
    """The position the client resumed from (the audit's ``from_position``)."""
    reached: Position
    """The checkpoint: the last position recovered so far."""
    target: int
    """The subject's seq when the resume started: slices go up to it."""
    conflation_ms: int


class SlicedResumes:
    """Hub methods answering a resume (whole or in slices)."""

    _subjects: dict[str, SubjectState]
    epoch: int
    numbered_elsewhere: bool
    recovery: SharedRecovery
    _publish_snapshot: bool
    _sinks: int

    def _state(self, subject: str) -> SubjectState:
        raise NotImplementedError

    def _drop_subscription(self, state: SubjectState, sink: AnySink) -> None:
        raise NotImplementedError

    def _add_subscription(
        self, state: SubjectState, sink: AnySink, period: int, now: float
    ) -> None:
        raise NotImplementedError

    def _ahead(self, state: SubjectState, position: Position) -> bool:
        raise NotImplementedError

    def _unplaced(self, state: SubjectState, position: Position) -> bool:
        raise NotImplementedError

    if TYPE_CHECKING:  # (SubjectExpiry's, WaitingResumes', after this class in the hub's bases)
        def may_have_forgotten(self, subject: str) -> bool: ...

        def _wait(self, state: SubjectState, sink: AnySink, waiting: WaitingResume) -> None:
            ...

    def continue_resume(
        self, sink: AnySink, cursor: ResumeCursor, now: float, limit: int
    ) -> tuple[list[ops.ServerOp], ResumeCursor | None]:
        """The next slice of a resume :meth:`start_resume` began (at most ``limit``
        messages), and the cursor to go on from, None once the resume is over."""
        state = self._state(cursor.subject)
        sinks = state.sinks
        try:
            position = cursor.reached
            if self._ahead(state, position) or self._unplaced(state, position):
                # the member moved back (a cluster reposition): wait as a resume from here
                self._wait(state, sink, WaitingResume(position, cursor.conflation_ms))
                if self._unplaced(state, position) and self.may_have_forgotten(state.subject):
                    return [ops.SubjectStatus(ops.Status.DATA_RESYNC, state.subject, None)], None
                return [], None
            return self._recover(state, sink, cursor, now, limit)
        finally:
            self._sinks += state.sinks - sinks

    def _resume_from(
        self, state: SubjectState, sink: AnySink, request: ops.SubscriptionRequest,
        period: int, now: float, limit: int | None, sliced: bool = False,
    ) -> tuple[list[ops.ServerOp], ResumeCursor | None]:
        """What a resume from ``request.position`` gets after its ``SUBSCRIBE_ALLOW``: the
        snapshot as of that position first if asked (``snapshot``), then the history as
        of it (``history``), then the messages after it -- all of them (``limit`` None),
        or a first slice and a cursor for the rest."""
        position = request.position
        assert position is not None
        cursor = ResumeCursor(state.subject, position, position, state.seq, period)
        out: list[ops.ServerOp] = []
        if request.snapshot:
            owed = snapshot_as_of(state, position, publish_snapshot=self._publish_snapshot)
            if owed is GONE or self._missed(state, position, 0) is None:
                return self._resync(state, sink, period, now), None
            if isinstance(owed, Message):
                out.append(ops.Deliver((owed,)))  # the snapshot as of ``position``
        history = request.history
        if (history > 0 and position.epoch == state.epoch and position.seq <= state.seq
                and self._missed(state, position, 0) is not None):
            # the newest ``history`` up to ``position`` (only those built: a resume far
            # back built all it would recover too, in this step)
            deliver = history_op(state.cache.run_until(position.seq, history), sliced)
            if deliver is not None:
                out.append(deliver)
        answer, rest = self._recover(state, sink, cursor, now, limit)
        return out + answer, rest

    def _recover(
        self, state: SubjectState, sink: AnySink, cursor: ResumeCursor, now: float,
        limit: int | None,
    ) -> tuple[list[ops.ServerOp], ResumeCursor | None]:
        """The messages after ``cursor.reached`` (at most ``limit`` while short of its
        target), then, once at the subject's position, the subscription and DATA_SYNC."""
        position = cursor.reached
        start = position.seq if position.epoch == state.epoch else 0
        if limit is not None and start + limit >= max(cursor.target, start + 1):
            limit = None  # the last slice: everything up to the subject's position
        end = state.seq if limit is None else min(state.seq, start + limit)
        recovered = self.recovery.batch(
            BatchKey(state.subject, state.epoch, position, end, state.cache.first_seq),
            lambda: self._missed(state, position, limit))
        if recovered is None:
            return self._resync(state, sink, cursor.conflation_ms, now), None
        out: list[ops.ServerOp] = []
        if recovered.missed:
            out.append(recovered.deliver)
        if end < state.seq:
            return out, cursor._replace(reached=Position(state.epoch, end))
        self._add_subscription(state, sink, cursor.conflation_ms, now)
        out.append(ops.SubjectStatus(ops.Status.DATA_SYNC, state.subject, state.position))
        return out, None

    def _resync(
        self, state: SubjectState, sink: AnySink, period: int, now: float
    ) -> list[ops.ServerOp]:
        """The snapshot and DATA_RESYNC, the client subscribed from there."""
        self._add_subscription(state, sink, period, now)
        out: list[ops.ServerOp] = []
        if state.snapshot is not None:
            out.append(ops.Deliver((state.snapshot,)))
        # (never unplaced here: such a resume waits, see Hub._subscribe)
        out.append(ops.SubjectStatus(ops.Status.DATA_RESYNC, state.subject, state.position))
        return out

    def _missed(
        self, state: SubjectState, position: Position, limit: int | None = None
    ) -> list[Message] | None:
        """The messages after ``position`` (at most ``limit``), or None when they cannot
        be told."""
        if position.epoch == state.epoch:
            return state.cache.since(position.seq, limit)
        if position == Position(self.epoch, 0):
            # The client saw nothing of a subject that was not numbered yet where it
            # subscribed (a cluster peer sharing this hub's epoch): all of it is missed.
            return state.cache.since(0, limit)
        return None
