"""The recent committed batches a member keeps to catch up a (re)joining non-seed.

Bounded by batches, by messages (a ring of 20,000 batches of 300 messages each
would be millions of messages) and by bytes (100,000 messages of 128 KiB would be
12.8 GB, outside every memory budget; a follower the ring no longer reaches gets a
whole cache sync instead, :mod:`cluster.link_sync`), and kept packed: each batch is a tuple of
:func:`~migratory.model.message.pack`-ed messages, which CPython's collector stops
tracking. Kept as ``CommittedBatch`` objects, the ring was most of a seed's
long-lived objects (one tracked ``Message`` per message, ~50,000 at 1,000
publishes/s) and every full collection walked them: ~180 ms pauses on the leader,
the p99.9 of acknowledgement latency (docs/benchmarks.md, issue 8). Batches are
rebuilt only to catch a follower up, which is rare.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterator

from cluster.coordination import CommittedBatch
from migratory.model.message import PackedMessage, pack, packed_size, unpack

RING_BATCHES = 20_000
"""Committed batches kept at most."""
RING_MESSAGES = 100_000
"""Messages kept at most, over all kept batches."""
RING_BYTES = 64 * 1024 * 1024
"""Content, subject and field bytes kept at most, over all kept batches (the newest
batch is kept whatever its size)."""

# (clsn, packed messages, origins, bytes, repeats, overtaken)
_Entry = tuple[
    int, tuple[PackedMessage, ...], tuple[tuple[str, int], ...], int,
    tuple[tuple[str, int, int, int], ...], tuple[tuple[str, int], ...],
]


class BatchRing:
    """The last committed batches, oldest first, in CLSN order with no holes."""

    __slots__ = (
        "_bytes", "_entries", "_max_batches", "_max_bytes", "_max_messages", "_messages",
    )

    def __init__(
        self,
        *,
        max_batches: int = RING_BATCHES,
        max_messages: int = RING_MESSAGES,
        max_bytes: int = RING_BYTES,
    ) -> None:
        if max_batches < 1 or max_messages < 1 or max_bytes < 1:
            raise ValueError(
                f"a ring keeps at least one batch, one message and one byte, got"
                f" {max_batches} batches, {max_messages} messages and {max_bytes} bytes"
            )
        self._entries: deque[_Entry] = deque()
        self._max_batches = max_batches
        self._max_messages = max_messages
        self._max_bytes = max_bytes
        self._messages = 0
        self._bytes = 0

    @property
    def bytes(self) -> int:
        """Content, subject and field bytes of the kept batches."""
        return self._bytes

    def __len__(self) -> int:
        return len(self._entries)

    @property
    def first_clsn(self) -> int | None:
        """The CLSN of the oldest batch kept, or None when empty."""
        return self._entries[0][0] if self._entries else None

    def append(self, batch: CommittedBatch) -> None:
        """The next committed batch (CLSN one more than the last one kept)."""
        entries = self._entries
        if entries and batch.clsn != entries[-1][0] + 1:
            self.clear()  # a jump (a sync): older batches no longer lead up to it
        packed = tuple(map(pack, batch.messages))
        size = sum(map(packed_size, packed))
        entries.append((batch.clsn, packed, batch.origins, size, batch.repeats, batch.overtaken))
        self._messages += len(packed)
        self._bytes += size
        while len(entries) > 1 and (
            len(entries) > self._max_batches
            or self._messages > self._max_messages
            or self._bytes > self._max_bytes
        ):
            _, dropped, _, dropped_size, _, _ = entries.popleft()
            self._messages -= len(dropped)
            self._bytes -= dropped_size

    def clear(self) -> None:
        self._entries.clear()
        self._messages = 0
        self._bytes = 0

    def after(self, clsn: int) -> Iterator[CommittedBatch]:
        """The kept batches after ``clsn``, rebuilt, oldest first."""
        for batch_clsn, messages, origins, _, repeats, overtaken in self._entries:
            if batch_clsn > clsn:
                yield CommittedBatch(batch_clsn, tuple(map(unpack, messages)), origins, repeats,
                                     overtaken)
