"""Resumes waiting for a lagging member. A mixin of :class:`~migratory.server.hub.Hub`.

A client resuming from a position this member has not reached yet (it lags the
cluster, or has not numbered the subject yet) gets nothing but its ``SUBSCRIBE_ALLOW``
until the member catches up (``Hub._subscribe``): its resume waits in
``SubjectState.waiting``. When the subject reaches it, the resume is answered.

Two things made that a stall of the event loop (docs/benchmarks.md, "A lagging
member's waiting resumes"):

- every message applied looked at every waiting resume of its subject, to find those
  it caught up with: 10,000 clients waiting 100 messages ahead cost 10,000 looks per
  message, ~2 ms each, one committed batch after another. Now the subject keeps the
  lowest position at which a waiting resume may settle (``settle_at``, for the epoch it
  was worked out in); a message short of it looks at none;
- the resumes settled were all answered at once, in the step that applied the message
  -- every client of the subject, each with what it missed (80-160 ms for 10,000).
  Now a sink that can answer in its own turns (``resume_settled``: a native session)
  is handed its resume: it is moved to ``SubjectState.settling`` and its session
  asks for it with :meth:`WaitingResumes.settle_resume`, in slices
  (:mod:`~migratory.server.hub_resume`), through the loop's turn budget. Meanwhile it
  is neither waiting nor subscribed: what is published meanwhile is cached and
  recovered by its resume, once, in order; a member that moved back meanwhile makes
  it wait again. A sink without it (a test's) is answered at once, as before.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from migratory.model.position import Position
from migratory.protocol import ops
from migratory.server.format_sink import AnySink, send_op
from migratory.server.subject_state import SubjectState, WaitingResume

if TYPE_CHECKING:
    from migratory.server.hub_resume import ResumeCursor

NEVER = 1 << 62
"""``settle_at`` of a subject with no resume waiting."""


def settles_at(state: SubjectState, position: Position) -> int:
    """The subject's seq from which a resume waiting at ``position`` no longer waits
    (in the subject's current epoch): its seq in that epoch, the first numbered in
    another (unplaced until then: ``Hub._unplaced``)."""
    return position.seq if position.epoch == state.epoch else 1


class WaitingResumes:
    """Hub methods for resumes waiting until this member catches up."""

    _subjects: dict[str, SubjectState]
    _sinks: int

    def _ahead(self, state: SubjectState, position: Position) -> bool:
        raise NotImplementedError

    def _unplaced(self, state: SubjectState, position: Position) -> bool:
        raise NotImplementedError

    if TYPE_CHECKING:  # (SlicedResumes', SubjectExpiry's: not to shadow them)
        def _resume_from(
            self, state: SubjectState, sink: AnySink, request: ops.SubscriptionRequest,
            period: int, now: float, limit: int | None,
        ) -> tuple[list[ops.ServerOp], ResumeCursor | None]: ...

        def may_have_forgotten(self, subject: str) -> bool: ...

    def _wait(self, state: SubjectState, sink: AnySink, waiting: WaitingResume) -> None:
        """``sink``'s resume waits until this member reaches ``waiting.position``."""
        if not state.waiting:
            state.settle_at, state.settle_epoch = NEVER, state.epoch
        state.waiting[sink] = waiting
        if state.settle_epoch == state.epoch:  # (else the next message looks at all)
            state.settle_at = min(state.settle_at, settles_at(state, waiting.position))

    def _may_settle(self, state: SubjectState) -> bool:
        """A waiting resume may settle at the subject's position (else none can)."""
        return state.seq >= state.settle_at or state.epoch != state.settle_epoch

    def _settle_waiting(self, state: SubjectState, now: float) -> None:
        """Start the waiting resumes this member has now caught up with: handed to their
        sessions (``resume_settled``), or answered here for a sink that cannot take it."""
        settle_at = NEVER
        for sink, waiting in list(state.waiting.items()):
            position = waiting.position
            if self._ahead(state, position) or self._unplaced(state, position):
                settle_at = min(settle_at, settles_at(state, position))
                continue
            del state.waiting[sink]
            hand_over = getattr(sink, "resume_settled", None)
            if hand_over is not None:
                state.settling[sink] = waiting
                hand_over(state.subject)
                continue
            request = ops.SubscriptionRequest(state.subject, position=position,
                                              snapshot=waiting.snapshot,
                                              history=waiting.history)
            answer, _ = self._resume_from(state, sink, request, waiting.conflation_ms, now,
                                          None)
            for op in answer:
                send_op(sink, op)
        state.settle_at, state.settle_epoch = settle_at, state.epoch

    def settle_resume(
        self, sink: AnySink, subject: str, now: float, limit: int
    ) -> tuple[list[ops.ServerOp], ResumeCursor | None, Position | None]:
        """The first slice (at most ``limit`` messages) of ``sink``'s resume of ``subject``
        handed over by ``resume_settled``, the cursor of the rest, and the position it
        resumed from; nothing if it is no longer settling (unsubscribed, resubscribed).
        Waits again if the member moved back meanwhile (a cache sync)."""
        state = self._subjects.get(subject)
        if state is None:
            return [], None, None
        waiting = state.settling.pop(sink, None)
        if waiting is None:
            return [], None, None
        sinks = state.sinks
        try:
            position = waiting.position
            if self._ahead(state, position) or self._unplaced(state, position):
                self._wait(state, sink, waiting)
                if self._unplaced(state, position) and self.may_have_forgotten(subject):
                    return ([ops.SubjectStatus(ops.Status.DATA_RESYNC, subject, None)], None,
                            position)
                return [], None, position
            request = ops.SubscriptionRequest(subject, position=position,
                                              snapshot=waiting.snapshot,
                                              history=waiting.history)
            answer, cursor = self._resume_from(state, sink, request, waiting.conflation_ms,
                                               now, limit)
            return answer, cursor, position
        finally:
            self._sinks += state.sinks - sinks
