"""The QoS 1 messages an MQTT session sent and the client has not acknowledged yet:
their packet identifiers, and which subjects have one outstanding (a persistent
session's saved position of such a subject waits for its PUBACK).

A subject's position moves on only up to its oldest delivery not acknowledged: a PUBACK
of a later one that comes first (a client acknowledging out of order, which MQTT 3.1.1
section 4.6 forbids it) is held until the earlier ones have theirs. Before, it was saved
at once, and a resume after a member's kill skipped the earlier one."""

from __future__ import annotations

from collections import deque

from migratory.model.position import Position

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
    __slots__ = ("_by_id", "_early", "_next", "_per_subject", "limit")

    def __init__(self, limit: int = MAX_INFLIGHT) -> None:
        self._by_id: dict[int, tuple[str, Position]] = {}
        # per subject, the packet identifiers outstanding in the order they were sent
        self._per_subject: dict[str, deque[int]] = {}
        self._early: set[int] = set()  # acknowledged before an earlier one of the subject
        self._next = 0
        self.limit = limit

    def __len__(self) -> int:
        return len(self._by_id)

    def full(self) -> bool:
        return len(self._by_id) >= self.limit

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
        self._by_id[packet_id] = (subject, position)
        sent = self._per_subject.get(subject)
        if sent is None:
            sent = self._per_subject[subject] = deque()
        sent.append(packet_id)
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
        reached = by_id.pop(sent.popleft())[1]
        while sent and sent[0] in early:
            early.discard(sent[0])
            reached = by_id.pop(sent.popleft())[1]
        if not sent:
            del self._per_subject[subject]
        return subject, reached
