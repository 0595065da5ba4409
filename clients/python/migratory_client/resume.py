"""Per-subject resume state: what was delivered, what is a duplicate, what is a gap.

Sans-I/O: the session feeds statuses and messages in, and reads verdicts and the
subscription request to (re)send. The rules (docs/protocol.md, "Positions"):

* ``position`` is the last position delivered to the application, or the position
  to start from that the server gave (SUBSCRIBE_ALLOW on a first subscribe,
  DATA_SYNC / DATA_RESYNC after a resume).
* Messages of type ``update`` / ``recovered`` of the same epoch with ``seq <= position.seq``
  are duplicates and dropped; ``seq == position.seq + 1`` is delivered. A higher seq is a
  gap (unless the subscription is conflated, where skipping is the point): the message
  is not delivered and the subject is resubscribed from ``position``, so the missing
  messages come back as ``recovered``.
* A message of another epoch starts a new lineage and is delivered.
* ``snapshot`` and ``historical`` messages pass through untouched; their type tells
  the application what they are.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

from migratory.model.message import Message, MessageType
from migratory.model.position import Position
from migratory.protocol.ops import Status, SubscriptionRequest

__all__ = ["SubjectTracker", "Verdict"]

_PASS_THROUGH = frozenset({MessageType.SNAPSHOT, MessageType.HISTORICAL})
_CONFLATION_UNIT_MS = 100


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

    @property
    def conflated(self) -> bool:
        return self.conflation_ms >= _CONFLATION_UNIT_MS

    def request(self) -> SubscriptionRequest:
        """The subscription to send: a resume from ``position`` once there is one."""
        if self.position is None:
            return SubscriptionRequest(self.subject, None, self.history, self.conflation_ms)
        return SubscriptionRequest(self.subject, self.position, 0, self.conflation_ms)

    def on_status(self, status: Status, position: Position | None) -> None:
        """Apply a subject status from the server."""
        if status is Status.SUBSCRIBE_DENY:
            self.denied = True
        elif status is Status.SUBSCRIBE_ALLOW:
            self.denied = False
            if self.position is None:  # on a resume, recovered messages come next
                self.position = position
        elif status in (Status.DATA_SYNC, Status.DATA_RESYNC):
            self.recovering = False
            if position is not None:
                self._continue_from(position)

    def _continue_from(self, position: Position) -> None:
        # Within one epoch never move back: positions are never reused, so anything
        # at or below what was delivered is the same message again.
        if self.position is None or self.position.epoch != position.epoch:
            self.position = position
        else:
            self.position = max(self.position, position)

    def on_message(self, message: Message) -> Verdict:
        """Decide about one message of this subject and advance ``position`` if delivered."""
        if message.type in _PASS_THROUGH:
            return Verdict.DELIVER
        arrived = Position(message.epoch, message.seq)
        last = self.position
        if last is None or arrived.epoch != last.epoch:
            self.position = arrived
            return Verdict.DELIVER
        if arrived.seq <= last.seq:
            return Verdict.DUPLICATE
        if arrived.seq == last.seq + 1 or self.conflated:
            self.position = arrived
            return Verdict.DELIVER
        if self.recovering:
            return Verdict.DUPLICATE
        self.recovering = True
        return Verdict.GAP

    def on_session_lost(self) -> None:
        """The connection is gone; the next session resubscribes every subject anyway."""
        self.recovering = False
