"""A WebSocket session's subscriptions: the subjects it holds and the subscribe entries
taken but not answered yet.

A subscribe is checked whole when it arrives (its size, what its answer would cost:
``admission``); its entries are then answered a few per loop turn, each one checked (the
subscription limit, the subject, the reserved MQTT-session prefix, entitlement) and
answered by the hub: the snapshot, or the recovered messages and DATA_SYNC /
DATA_RESYNC of a resume, which is counted and audited. A resume is answered in slices of
at most :data:`SLICE_MESSAGES` recovered messages (``hub_resume``): the rest waits at the
head of the entries as a cursor, each slice counted in the connection's work per turn.
"""

from __future__ import annotations

import logging
from collections import deque
from collections.abc import Set as AbstractSet
from typing import Any, NamedTuple, Protocol

from migratory import client_lines
from migratory.entitlement_decisions import ClientIdentity, DecisionPending
from migratory.model.outbox import Outbox
from migratory.model.subject import InvalidSubjectError, reserved, validate_subject
from migratory.protocol import ops
from migratory.server import admission
from migratory.server.context import ServerContext
from migratory.server.history_frame import HistoryFrame, SlicedHistory
from migratory.server.hub import ResumeCursor

log = logging.getLogger("migratory.session")


class Subscriber(Protocol):
    """What the subscriptions ask of their session (which is also the hub's sink)."""

    @property
    def identity(self) -> ClientIdentity | None: ...

    @property
    def outbox(self) -> Outbox: ...

    def deliver(self, frame: bytes) -> None: ...

    def send_op(self, op: ops.ServerOp) -> None: ...

    def describe(self) -> str: ...

    def log_fields(self) -> dict[str, Any]: ...

    def audit_client(self) -> dict[str, Any]: ...

    def hold_history(self, bound: int) -> bool: ...

    def fill_history(self, frame: bytes, *, write: bool = True) -> None: ...


_NO_SUBJECTS: frozenset[str] = frozenset()


class SettledResume(NamedTuple):
    """A resume that waited for this member to catch up and now may be answered
    (``Hub.settle_resume``, :mod:`~migratory.server.hub_settle`)."""

    subject: str

SLICE_MESSAGES = 128
"""Recovered messages one slice of a resume holds at most (~0.5 ms of the loop)."""
MESSAGES_PER_UNIT = 16
"""A slice counts one operation per this many messages it delivers, and one per
``admission.WORK_UNIT_BYTES`` of their contents, against the operations a connection
may have processed per loop turn (and the server's per turn: ``loop_turns``)."""


SLICE_UNITS = 1 + SLICE_MESSAGES // MESSAGES_PER_UNIT
"""What one answer counts for at most (but for its contents' bytes)."""


def answer_units(answer: list[ops.ServerOp]) -> int:
    """The work an answer counts for: one, and its messages (see MESSAGES_PER_UNIT)."""
    messages = size = 0
    for op in answer:
        if isinstance(op, ops.Deliver):
            messages += len(op.messages)
            size += sum(len(m.content) for m in op.messages)
    return 1 + messages // MESSAGES_PER_UNIT + size // admission.WORK_UNIT_BYTES


class Subscriptions:
    __slots__ = ("_ctx", "_queued", "_session", "_subjects")

    def __init__(self, session: Subscriber, ctx: ServerContext) -> None:
        self._session = session
        self._ctx = ctx
        self._subjects: set[str] | None = None  # made at the first subscription (216 bytes)
        # subscribe entries taken but not answered yet (a few per loop turn: Session.process),
        # a resume under way first (its cursor); made only when a subscribe waits: an empty
        # deque is 760 bytes per idle connection
        self._queued: deque[
            ops.SubscriptionRequest | ResumeCursor | SettledResume | HistoryFrame] | None = None

    @property
    def subjects(self) -> AbstractSet[str]:
        """The subjects subscribed to (read-only: they change through this object)."""
        return self._subjects if self._subjects is not None else _NO_SUBJECTS

    @property
    def waiting(self) -> bool:
        """Entries of a subscribe are still to be answered."""
        return bool(self._queued)

    @property
    def settling(self) -> bool:
        """The first entry waiting is a resume the hub settled or the rest of one, or a
        history being made: no check of the client's left to do (:meth:`answer_settled`
        may answer it)."""
        queued = self._queued
        return queued is not None and bool(queued) and isinstance(
            queued[0], SettledResume | ResumeCursor | HistoryFrame)

    def settled(self, subject: str) -> None:
        """The hub settled a waiting resume of ``subject``: answer it in a later turn."""
        if self._queued is None:
            self._queued = deque()
        self._queued.append(SettledResume(subject))

    def answer_settled(self, now: float, budget: int) -> int:
        """Answer settled resumes (slices of them) first in line, for about ``budget``
        units of work; the units done."""
        done = 0
        while self.settling and not (done and done + SLICE_UNITS > budget):
            done += self.answer_next(now)
        return done

    def take(self, requests: tuple[ops.SubscriptionRequest, ...]) -> None:
        """Check the whole subscribe before any of it is answered: its size, then what
        its answer would cost (admission.py). The entries are answered by
        :meth:`answer_next`, a few per loop turn."""
        # (nothing is queued here: operations are read only once the queue is empty)
        session = self._session
        denials = admission.refuse_subscribe(self._ctx, session.outbox, requests)
        if denials is None:
            if self._queued is None:
                self._queued = deque(requests)
            else:
                self._queued.extend(requests)
            return
        client_lines.lines.log(log, logging.INFO, "subscribe refused", "%s: %s",
                               session.describe(), denials[0].reason,
                               extra=session.log_fields())
        for denial in denials:
            session.send_op(denial)

    def answer_next(self, now: float) -> int:
        """Answer the first entry waiting, or the next slice of a resume under way; the
        work it counts for (:func:`answer_units`)."""
        queued = self._queued
        assert queued is not None, "answer_next without an entry waiting"
        entry = queued.popleft()
        if not queued:
            self._queued = None
        if isinstance(entry, HistoryFrame):
            return self._make_history(entry)
        history: HistoryFrame | None = None
        try:
            if isinstance(entry, ResumeCursor):
                answer, cursor = self._ctx.hub.continue_resume(
                    self._session, entry, now, SLICE_MESSAGES)
                self._send(answer, entry.since)
            elif isinstance(entry, SettledResume):
                answer, cursor, since = self._ctx.hub.settle_resume(
                    self._session, entry.subject, now, SLICE_MESSAGES)
                self._send(answer, since)
            else:
                answer, cursor = self._answer(entry, now)
                history = next((op.history for op in answer
                                if isinstance(op, SlicedHistory)), None)
        except DecisionPending:  # asked again once the entitlement has decided
            if self._queued is None:
                self._queued = deque()
            self._queued.appendleft(entry)
            raise
        if history is not None and self._session.outbox.holding:
            # its slices before the next entry; after the rest of the resume, if any,
            # whose slices go on in their steps as before, queued behind its place
            if self._queued is None:
                self._queued = deque()
            self._queued.appendleft(history)
        if cursor is not None:  # the rest of the resume, before the next entry
            if self._queued is None:
                self._queued = deque()
            self._queued.appendleft(cursor)
        return answer_units(answer)

    def _make_history(self, history: HistoryFrame) -> int:
        """The next slice of a history being made; the frame in its place once made."""
        messages, size = history.advance(SLICE_MESSAGES)
        if history.made:
            self._session.fill_history(history.frame())
        else:
            if self._queued is None:
                self._queued = deque()
            self._queued.appendleft(history)
        return 1 + messages // MESSAGES_PER_UNIT + size // admission.WORK_UNIT_BYTES

    def _send(self, answer: list[ops.ServerOp], position: object) -> None:
        session = self._session
        for op in answer:
            if isinstance(op, ops.SubjectStatus) and position is not None:
                self._resumed(op, position)
            if isinstance(op, SlicedHistory):  # made in slices (answer_next), its place held
                session.hold_history(op.history.bound)
            else:
                session.send_op(op)

    def _answer(
        self, request: ops.SubscriptionRequest, now: float
    ) -> tuple[list[ops.ServerOp], ResumeCursor | None]:
        """Check an entry and answer it (a resume: its first slice, and its cursor)."""
        session = self._session
        assert session.identity is not None
        subject = request.subject
        stats = self._ctx.stats
        over = admission.subscription_limit(self._ctx, self.subjects, subject)
        if over is None:
            try:
                validate_subject(subject)
            except InvalidSubjectError as exc:
                over = exc.reason
        if over is None:
            over = reserved(subject)
        if over is None and not self._ctx.entitlement.allow_subscribe(session.identity, subject):
            self._ctx.stats.count(self._ctx.stats.entitlement_denials, "subscribe")
            over = "not entitled to subscribe"
        if over is not None:
            self._deny(subject, over)
            return [], None
        if subject not in self.subjects:
            stats.subscriptions_open += 1
        if self._subjects is None:
            self._subjects = set()
        self._subjects.add(subject)
        audit = self._ctx.audit
        if audit is not None and audit.access:
            audit.event("access", "subscribe", session.audit_client(), subject=subject,
                        outcome="allowed", position=request.position)
        answer, cursor = self._ctx.hub.start_resume(session, request, now, SLICE_MESSAGES,
                                                    sliced_history=True)
        self._send(answer, request.position)
        return answer, cursor

    def _resumed(self, op: ops.SubjectStatus, position: object) -> None:
        """Count (and audit) a resume's outcome: DATA_SYNC or DATA_RESYNC."""
        if op.status is ops.Status.DATA_SYNC:
            outcome = "sync"
        elif op.status is ops.Status.DATA_RESYNC:
            outcome = "resync"
        else:
            return
        stats = self._ctx.stats
        stats.count(stats.resumes, outcome)
        audit = self._ctx.audit
        if audit is not None and audit.cache:
            audit.event("cache", "resume", self._session.audit_client(), subject=op.subject,
                        outcome=outcome, from_position=position, position=op.position)

    def _deny(self, subject: str, reason: str) -> None:
        audit = self._ctx.audit
        if audit is not None and audit.access:
            audit.event("access", "subscribe", self._session.audit_client(), subject=subject,
                        outcome="denied", reason=reason)
        self._session.send_op(
            ops.SubjectStatus(ops.Status.SUBSCRIBE_DENY, subject, reason=reason)
        )

    def unsubscribe(self, subjects: tuple[str, ...]) -> None:
        for subject in subjects:
            if self._subjects is not None and subject in self._subjects:
                self._subjects.discard(subject)
                self._ctx.stats.subscriptions_open -= 1
                self._ctx.hub.unsubscribe(self._session, subject)

    def forget(self) -> None:
        """Forget every subscription and every entry waiting (idempotent). A history
        being made is made now, in its place: a close frame queued after it follows it,
        as it did when the history was made whole."""
        for history in self._queued or ():
            # (after the rest of a resume, maybe; not once the outbox was dropped)
            if isinstance(history, HistoryFrame) and self._session.outbox.holding:
                history.advance(len(history))
                self._session.fill_history(history.frame(), write=False)
        self._queued = None
        hub = self._ctx.hub
        for subject in self.subjects:
            hub.unsubscribe(self._session, subject)
        self._ctx.stats.subscriptions_open -= len(self.subjects)
        self._subjects = None
