"""Batching on encrypted listeners: every few batch ticks, not every one.

A TLS record costs about 4 us of CPU on each side whatever it carries: OpenSSL's
per-record work on a connection state that has left the CPU caches in the 10 ms
since that connection's last record (docs/benchmarks.md, "where the TLS p99 cost
comes from"). Writing a busy encrypted client every ``EncryptedBatchTime`` (a
whole number of ``BatchTime`` ticks; off by default) cuts its records: with 1,000 TLS
subscribers of a subject at 100 messages/s, 20 ms (2 ticks) cut the server's CPU per
delivery by 13-15 % for 2-4 ms more at the median and the same p99 on a quiet
machine (docs/benchmarks.md, "EncryptedBatchTime"). A deployment short of CPU for
its TLS clients can take that trade.

The rule is the server's adaptive batching (``BatchIdleWrite``, ``Server.mark_dirty``)
over the longer period: a connection written within the last two periods waits for
the next encrypted tick; any other is written at once.
"""

from __future__ import annotations

from typing import Generic, TypeVar

__all__ = ["EncryptedBatches", "ticks_per_encrypted_batch"]

C = TypeVar("C")


def ticks_per_encrypted_batch(batch_time: int, encrypted_batch_time: int) -> int:
    """How many batch ticks an encrypted client's batch spans (1: like the others)."""
    if batch_time <= 0 or encrypted_batch_time <= batch_time:
        return 1
    return max(1, round(encrypted_batch_time / batch_time))


class EncryptedBatches(Generic[C]):
    """The encrypted connections that wait, and whom the last two periods wrote."""

    __slots__ = ("_ticks", "dirty", "every", "idle_write", "written", "written_before")

    def __init__(self, every: int, *, idle_write: bool = True) -> None:
        if every < 2:
            raise ValueError("an encrypted batch spans at least 2 ticks")
        self.every = every
        self.idle_write = idle_write
        self._ticks = 0
        self.dirty: set[C] = set()
        self.written: set[C] = set()  # by this period's tick, or idle writes since
        self.written_before: set[C] = set()  # in the period before

    def mark(self, connection: C) -> bool:
        """``connection`` has bytes to write: True to write it at once (it is idle),
        False when it waits for the next encrypted tick."""
        if (
            not self.idle_write
            or connection in self.written
            or connection in self.written_before
        ):
            self.dirty.add(connection)
            return False
        self.written.add(connection)
        return True

    def tick(self) -> set[C]:
        """One batch tick: the connections to write now (none until the period ends)."""
        self._ticks += 1
        if self._ticks % self.every:
            return set()
        dirty, self.dirty = self.dirty, set()
        self.written_before, self.written = self.written, set(dirty)
        return dirty

    def forget(self, connection: C) -> None:
        self.dirty.discard(connection)
        self.written.discard(connection)
        self.written_before.discard(connection)
