"""Per-subject resume state: what was delivered, what is a duplicate, what is a gap.

Sans-I/O: the session feeds statuses and messages in, and reads verdicts and the
subscription request to (re)send. The rules (docs/protocol.md, "Positions"):

* ``position`` is the last position delivered to the application, or the position
  to start from that the server gave (SUBSCRIBE_ALLOW on a first subscribe,
  DATA_SYNC / DATA_RESYNC after a resume).
* Messages of type ``update`` / ``recovered`` of the same epoch with ``seq <= position.seq``
  are duplicates and dropped, as are those of an epoch left behind at or below the highest
  seq reached in it (``highest``); ``seq == position.seq + 1`` is delivered. A higher seq is a
  gap (unless the subscription is conflated, where skipping is the point): the message
  is not delivered and the subject is resubscribed from ``position``, so the missing
  messages come back as ``recovered``.
* A message of another epoch starts a new lineage and is delivered when it is that
  lineage's first (seq 1; any seq on a conflated subscription). Further on, the
  messages before it are missing, or it is a stale one of a lineage left behind: a gap,
  as above, and the resume from ``position`` gets the server's ``DATA_SYNC`` or
  snapshot and ``DATA_RESYNC``, never a silent jump into the middle of an epoch.
* ``snapshot`` and ``historical`` messages do not move ``position``; their type tells
  the application what they are. They belong to the answer to a subscribe, which a
  ``SUBSCRIBE_ALLOW`` opens and the first ``update`` / ``recovered`` or ``DATA_SYNC`` /
  ``DATA_RESYNC`` closes: one snapshot, or up to ``history`` historical messages (a first
  subscribe), in order. Any other (a server's mistake: a snapshot again mid-stream, a
  history replayed) is dropped, or the application would get an old message after newer
  ones, or one twice.
* Before the ``SUBSCRIBE_ALLOW`` of a first subscribe (no ``position`` yet), an update
  is dropped: the server answers first, so it belongs to an earlier subscription of the
  subject on this connection, unsubscribed since (the application would see it, then
  the snapshot or history it is part of).
* A ``DATA_SYNC`` says every message up to its position was sent: one that moves
  ``position`` past messages never delivered (a server that lost some) is told to the
  application as ``DATA_RESYNC``, never a silent gap.
* ``DATA_SYNC`` / ``DATA_RESYNC`` move ``position`` only when they answer the latest
  request: the server answers the requests of one connection in order (each with one
  ``SUBSCRIBE_ALLOW`` or ``SUBSCRIBE_DENY`` first), so while a later request is
  unanswered, a status belongs to an earlier one, whose messages may have been dropped
  since (a gap). After messages were skipped (a paused subscription), no status moves
  ``position`` until a request sent since then is answered.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field

from migratory.model.message import Message, MessageType
from migratory.model.position import Position
from migratory.protocol.ops import Status, SubscriptionRequest

__all__ = ["SubjectTracker", "Verdict"]

_PASS_THROUGH = frozenset({MessageType.SNAPSHOT, MessageType.HISTORICAL})
_CONFLATION_UNIT_MS = 100
EPOCHS_REMEMBERED = 16
"""Epochs of one subject whose highest seq a tracker keeps (the most recent)."""


class Verdict(enum.Enum):
    """What to do with one received message."""

    DELIVER = "deliver"
    DUPLICATE = "duplicate"
    """Already delivered (or will come again as ``recovered``): drop it."""
    GAP = "gap"
    """Messages are missing before this one: drop it and resubscribe from ``position``."""


@dataclass(slots=True)
class SubjectTracker:
    """Resume state of one subscribed subject."""

    subject: str
    history: int = 0
    conflation_ms: int = 0
    position: Position | None = None
    denied: bool = False
    recovering: bool = False
    """A resubscribe after a gap is under way; later gaps are expected, not new."""
    requested_in: int = -1
    """Id of the session on which this subject was last subscribed."""
    answers_due: int = 0
    """Requests sent on session ``due_in`` that the server has not answered yet."""
    due_in: int = -1
    skipping: bool = False
    """Messages after ``position`` were dropped (its subscription paused): no status may
    move ``position`` until the server answers a request sent since."""
    asked_since_skip: bool = False
    restarting: bool = False
    """The resume's answer could never fit in the client's outbox: the subject starts
    again from the snapshot (a first subscribe without history), a resync to announce."""
    snapshot_due: bool = False
    """A subscribe's answer is open and has not had its snapshot yet."""
    historical_due: int = 0
    """Historical messages the open answer may still bring."""
    last_historical: Position | None = None
    highest: dict[int, int] = field(default_factory=dict)
    """The highest seq ``position`` reached in each epoch it was in (the last
    :data:`EPOCHS_REMEMBERED`): positions are never reused, so a message at or below it
    was delivered already (or precedes where the server started the subject), whatever
    epoch a status moved ``position`` to since -- a server that goes back to a lineage
    left behind gets no duplicate through."""
    historical_owed: int = 0
    """As ``snapshot_owed``, for a first subscribe with history: the historical messages
    it has not had yet, asked for again (as of ``position``) by the resume."""
    snapshot_owed: bool = False
    """A first subscribe's answer (no history) is open and its snapshot has not come:
    should the connection be lost now, the resume asks for the snapshot as of
    ``position`` (``SubscriptionRequest.snapshot``), or the application never gets it."""

    @property
    def conflated(self) -> bool:
        return self.conflation_ms >= _CONFLATION_UNIT_MS

    def request(self) -> SubscriptionRequest:
        """The subscription to send: a resume from ``position`` once there is one."""
        if self.position is None:
            history = 0 if self.restarting else self.history
            return SubscriptionRequest(self.subject, None, history, self.conflation_ms)
        return SubscriptionRequest(
            self.subject, self.position, self.historical_owed, self.conflation_ms,
            snapshot=self.snapshot_owed,
        )

    def sent(self, session_id: int) -> None:
        """A subscription request for this subject went out on session ``session_id``."""
        if self.due_in != session_id:
            self.due_in, self.answers_due = session_id, 0
        self.answers_due += 1
        self.asked_since_skip = self.skipping

    def restart(self) -> None:
        """Give up the resume: subscribe again from the snapshot (see ``restarting``)."""
        self.position, self.restarting, self.recovering = None, True, False

    def skip(self) -> None:
        """Messages of this subject are being dropped from now on (a paused subscription)."""
        self.skipping, self.asked_since_skip = True, False
        self.recovering = False

    def on_status(self, status: Status, position: Position | None, session_id: int = -1) -> bool:
        """Apply a subject status that arrived on session ``session_id``. Returns True
        for a ``DATA_SYNC`` that moved ``position`` past messages never delivered (the
        server said it sent every message up to it, and did not): a gap to announce."""
        awaited = self.due_in == session_id and self.answers_due > 0
        if status in (Status.SUBSCRIBE_ALLOW, Status.SUBSCRIBE_DENY) and awaited:
            self.answers_due -= 1
            if self.answers_due == 0 and self.asked_since_skip:
                self.skipping = self.asked_since_skip = False
        if status is Status.SUBSCRIBE_DENY:
            self.denied = True
        elif status is Status.SUBSCRIBE_ALLOW:
            self._allowed(position)
        elif status in (Status.DATA_SYNC, Status.DATA_RESYNC):
            self._close_answer()
        if status in (Status.DATA_SYNC, Status.DATA_RESYNC) and not (awaited or self.skipping):
            self.recovering = False
            if position is not None:
                skipped = status is Status.DATA_SYNC and self._skips_to(position)
                self._continue_from(position)
                return skipped
        return False

    def _allowed(self, position: Position | None) -> None:
        """A SUBSCRIBE_ALLOW opens the answer: on a first subscribe, its snapshot or
        history, and ``position`` to start from; on a resume, what a first answer cut
        short still owes (``snapshot_owed``, ``historical_owed``), or the snapshot of a
        DATA_RESYNC -- recovered messages come next."""
        self.denied = False
        if self.position is None:
            history = 0 if self.restarting else self.history
            self.snapshot_due, self.historical_due = history == 0, history
            self.snapshot_owed, self.historical_owed = history == 0, history
            self.last_historical = None
            if position is not None:
                self._move(position)
        else:  # (after the historical messages already delivered, if any)
            self.snapshot_due, self.historical_due = True, self.historical_owed

    def _skips_to(self, position: Position) -> bool:
        last = self.position
        if last is None or self.conflated:
            return False
        if last.epoch != position.epoch:
            return position.seq > 0  # the epoch's messages up to it never came
        return position.seq > last.seq

    def _continue_from(self, position: Position) -> None:
        # Within one epoch never move back: positions are never reused, so anything
        # at or below what was delivered is the same message again.
        self._move(position)

    def _move(self, position: Position) -> None:
        """``position`` becomes the position, or the highest reached in its epoch."""
        seq = max(self.highest.pop(position.epoch, -1), position.seq)
        self.highest[position.epoch] = seq  # (again) the most recent
        if len(self.highest) > EPOCHS_REMEMBERED:
            del self.highest[next(iter(self.highest))]
        self.position = position if seq == position.seq else Position(position.epoch, seq)

    def _close_answer(self) -> None:
        self.snapshot_due, self.historical_due = False, 0
        self.snapshot_owed, self.historical_owed = False, 0

    def _answer_message(self, message: Message) -> Verdict:
        """A snapshot or historical message: delivered only as part of an open answer."""
        if message.type is MessageType.SNAPSHOT:
            if not self.snapshot_due or self._stale(message):
                return Verdict.DUPLICATE
            self.snapshot_due = self.snapshot_owed = False
            return Verdict.DELIVER
        arrived, last = Position(message.epoch, message.seq), self.last_historical
        if self.historical_due == 0 or (
            last is not None and last.epoch == arrived.epoch and arrived.seq <= last.seq
        ):
            return Verdict.DUPLICATE
        self.historical_due -= 1
        self.historical_owed = max(0, self.historical_owed - 1)
        self.last_historical = arrived
        return Verdict.DELIVER

    def _stale(self, message: Message) -> bool:
        """A snapshot at or before the highest position reached in its epoch, on a
        subscription that began with the snapshot and was not owed one: every retained
        message it merges reached the application already (in that first snapshot or as
        an update), so it would only bring old state back after newer (a resume's
        snapshot from a server that then says DATA_SYNC, or one cache-expired behind
        the position: DATA_RESYNC tells the application that much)."""
        return (
            not self.snapshot_owed
            and self.history == 0
            and message.seq <= self.highest.get(message.epoch, -1)
        )

    def on_message(self, message: Message) -> Verdict:
        """Decide about one message of this subject and advance ``position`` if delivered."""
        if message.type in _PASS_THROUGH:
            return self._answer_message(message)
        self._close_answer()  # what belongs to the answer comes before any update
        arrived = Position(message.epoch, message.seq)
        last = self.position
        if arrived.seq <= self.highest.get(arrived.epoch, -1):
            return Verdict.DUPLICATE  # (in the current epoch: at or before ``position``)
        if last is None:
            if self.answers_due > 0:  # before the first subscribe's SUBSCRIBE_ALLOW: a
                return Verdict.DUPLICATE  # message of an earlier subscription, left
            self._move(arrived)
            return Verdict.DELIVER
        if arrived.epoch != last.epoch:
            if arrived.seq == 1 or self.conflated:  # a new lineage, from its start
                self._move(arrived)
                return Verdict.DELIVER
            return self._gap()
        if arrived.seq <= last.seq:
            return Verdict.DUPLICATE
        if arrived.seq == last.seq + 1 or self.conflated:
            self._move(arrived)
            return Verdict.DELIVER
        return self._gap()

    def _gap(self) -> Verdict:
        if self.recovering:
            return Verdict.DUPLICATE
        self.recovering = True
        return Verdict.GAP

    def on_session_lost(self) -> None:
        """The connection is gone; the next session resubscribes every subject anyway.
        A first subscribe's answer cut after its SUBSCRIBE_ALLOW and before its snapshot
        (or its history) is resumed from the ALLOW's position asking for the snapshot
        (the historical messages not had) as of it (``snapshot_owed``,
        ``historical_owed``): they come, then the updates missed (docs/protocol.md,
        "What the SDKs do with a broken server")."""
        self.recovering = False
