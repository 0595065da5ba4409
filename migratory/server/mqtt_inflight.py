"""The QoS 1 messages an MQTT session sent and the client has not acknowledged yet:
their packet identifiers, and which subjects have one outstanding (a persistent
session's saved position of such a subject waits for its PUBACK).

A subject's position moves on only up to its oldest delivery not acknowledged: a PUBACK
of a later one that comes first (a client acknowledging out of order, which MQTT 3.1.1
section 4.6 forbids it) is held until the earlier ones have theirs. Before, it was saved
at once, and a resume after a member's kill skipped the earlier one.

An entry holds its position as two integers, not a :class:`Position`: a tuple of a
string and integers is one the garbage collector stops tracking at its first collection
(CPython untracks tuples of atoms), where one holding a ``Position`` (an object of its
own per delivery: ``Message.position`` makes one) stayed tracked, both of them. 10,000
QoS 1 sessions holding a 400-message jump each were 8 million tracked objects and a full
collection of 1.4 s, landing in some session's refill (docs/benchmarks.md)."""

from __future__ import annotations

from collections import deque

from migratory.model.outbox import OutboxBudget
from migratory.model.position import Position, new_position

MAX_INFLIGHT = 65535  # every packet identifier taken
ENTRY_BYTES = 176
"""Memory one unacknowledged delivery holds here (its packet identifier, subject and
position; tracemalloc: 65,535 of them 11.5 MB): each counts this much against
ClientMaxPendingBytes (:func:`inflight_limit`)."""


def inflight_limit(max_pending_bytes: int) -> int:
    """QoS 1 deliveries a session may have unacknowledged: ClientMaxPendingBytes'
    worth of ENTRY_BYTES (23,831 for 4 MiB), never more than the packet identifiers."""
    return max(1, min(MAX_INFLIGHT, max_pending_bytes // ENTRY_BYTES))


class Inflight:
    """``budget``: the server's OutboxMemoryBudget, which each entry counts ENTRY_BYTES
    against, as the bytes queued in outboxes do: a subscriber that reads every message
    and acknowledges none holds no outbox, and 1,000 of them held 4 MiB each of these
    (docs/benchmarks.md, "QoS 1 messages not acknowledged, outside the budget"). Past the
    budget a session with more than a sixteenth of ``limit`` entries takes no more (its
    client is the slow consumer), as an outbox with more than a sixteenth of its own."""

    __slots__ = ("_budget", "_by_id", "_early", "_next", "_per_subject", "limit")

    def __init__(self, limit: int = MAX_INFLIGHT, budget: OutboxBudget | None = None) -> None:
        self._budget = budget
        self._by_id: dict[int, tuple[str, int, int]] = {}  # subject, epoch, seq
        # per subject, the packet identifiers outstanding in the order they were sent
        self._per_subject: dict[str, deque[int]] = {}
        self._early: set[int] = set()  # acknowledged before an earlier one of the subject
        self._next = 0
        self.limit = limit

    def __len__(self) -> int:
        return len(self._by_id)

    def full(self) -> str | None:
        """Why one more delivery may not be outstanding (the limit it would pass), or None."""
        count = len(self._by_id)
        if count >= self.limit:
            return f"{self.limit} QoS 1 messages not acknowledged (ClientMaxPendingBytes)"
        budget = self._budget
        if (budget is not None and budget.used + ENTRY_BYTES > budget.limit
                and count >= self.limit >> 4):
            return (f"{count} QoS 1 messages not acknowledged while the outboxes hold "
                    f"{budget.used} bytes (OutboxMemoryBudget)")
        return None

    def outstanding(self, subject: str) -> bool:
        return subject in self._per_subject

    def add(self, subject: str, position: Position) -> int:
        """A free packet identifier for a QoS 1 delivery (the caller checks ``full``)."""
        packet_id = self._next
        while True:
            packet_id = packet_id % 65535 + 1
            if packet_id not in self._by_id:
                break
        self._next = packet_id
        self._by_id[packet_id] = (subject, position.epoch, position.seq)
        sent = self._per_subject.get(subject)
        if sent is None:
            sent = self._per_subject[subject] = deque()
        sent.append(packet_id)
        if self._budget is not None:
            self._budget.used += ENTRY_BYTES
        return packet_id

    def acknowledge(self, packet_id: int) -> tuple[str, Position | None] | None:
        """What a PUBACK acknowledges: its subject and the position up to which the client
        now has acknowledged every delivery of it (None while an earlier one waits for its
        PUBACK: the identifier stays taken until then); None for an identifier not
        outstanding. O(1) per PUBACK, in any order."""
        delivered = self._by_id.get(packet_id)
        if delivered is None or packet_id in self._early:
            return None
        subject = delivered[0]
        sent = self._per_subject[subject]
        if sent[0] != packet_id:
            self._early.add(packet_id)
            return subject, None
        by_id, early = self._by_id, self._early
        before = len(by_id)
        reached = by_id.pop(sent.popleft())
        while sent and sent[0] in early:
            early.discard(sent[0])
            reached = by_id.pop(sent.popleft())
        if not sent:
            del self._per_subject[subject]
        if self._budget is not None:
            self._budget.used -= ENTRY_BYTES * (before - len(by_id))
        return subject, new_position(reached[1], reached[2])

    def release(self) -> None:
        """The connection is gone: its entries leave the budget."""
        if self._budget is not None:
            self._budget.used -= ENTRY_BYTES * len(self._by_id)
        self._by_id.clear()
        self._per_subject.clear()
        self._early.clear()
