"""The QoS 1 messages an MQTT session sent and the client has not acknowledged yet:
their packet identifiers, and which subjects have one outstanding (a persistent
session's saved position of such a subject waits for its PUBACK)."""

from __future__ import annotations

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
    __slots__ = ("_by_id", "_next", "_per_subject", "limit")

    def __init__(self, limit: int = MAX_INFLIGHT) -> None:
        self._by_id: dict[int, tuple[str, Position]] = {}
        self._per_subject: dict[str, int] = {}
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
        self._per_subject[subject] = self._per_subject.get(subject, 0) + 1
        return packet_id

    def acknowledge(self, packet_id: int) -> tuple[str, Position] | None:
        """What a PUBACK acknowledges; None for an identifier not outstanding."""
        delivered = self._by_id.pop(packet_id, None)
        if delivered is not None:
            subject = delivered[0]
            left = self._per_subject[subject] - 1
            if left:
                self._per_subject[subject] = left
            else:
                del self._per_subject[subject]
        return delivered
