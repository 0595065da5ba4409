"""The commit window: how many Raft commands a seed keeps in flight (group commit).

Every Raft command costs the leader the same fixed work whatever it carries -- a
journal write, an AppendEntries to every follower and another when it commits, each
pickled, compressed and encrypted (about 0.6 ms of CPU here). One command per publish
at 1,000 publishes/s kept this 2-core machine 150-170 % busy and the tail latency
followed the queueing. So a seed keeps at most :data:`COMMIT_WINDOW` commands in
flight: a publish that arrives while the window is full waits for a commit and shares
the next command with everything else that arrived meanwhile. When the cluster is
idle a publish is submitted at once (no linger); under load commands grow instead of
multiplying, and the wait adapts to the commit latency by itself.

A slot normally ends with the command's callback. pysyncobj calls it once the command's
index is applied (or refused), which can take as long as a majority is missing; a
slot older than :data:`SLOT_TIMEOUT` is given back anyway so a lost callback can never
stop a seed from submitting (the command itself is unaffected: its outcome still comes
from the committed stream or the barrier).

Pure bookkeeping plus one ``trio.Event``; :class:`CommitWindow` is driven by tests with
a fake clock.
"""

from __future__ import annotations

from collections.abc import Callable

import trio

from cluster.link_limits import MAX_COMMAND_BYTES as MAX_COMMAND_BYTES  # (re-exported)

COMMIT_WINDOW = 1
"""Raft commands a seed keeps in flight."""
SLOT_TIMEOUT = 2.0
"""Seconds after which a slot whose callback never came is given back."""


class CommitWindow:
    """At most ``size`` commands in flight; :meth:`acquire` waits for room."""

    def __init__(
        self,
        size: int = COMMIT_WINDOW,
        *,
        slot_timeout: float = SLOT_TIMEOUT,
        clock: Callable[[], float] = trio.current_time,
    ) -> None:
        if size < 1:
            raise ValueError(f"commit window size must be >= 1, got {size}")
        self.size = size
        self.slot_timeout = slot_timeout
        self._clock = clock
        self._slots: dict[int, float] = {}  # slot id -> when it was taken
        self._next_slot = 0
        self._room = trio.Event()
        self.reclaimed = 0
        """Slots given back by :data:`SLOT_TIMEOUT`, not by their callback."""

    @property
    def in_flight(self) -> int:
        return len(self._slots)

    def try_acquire(self) -> int | None:
        """A slot id, or ``None`` when the window is full (stale slots given back first)."""
        now = self._clock()
        for slot, taken in list(self._slots.items()):
            if now - taken >= self.slot_timeout:
                del self._slots[slot]
                self.reclaimed += 1
        if len(self._slots) >= self.size:
            return None
        self._next_slot += 1
        self._slots[self._next_slot] = now
        return self._next_slot

    def release(self, slot: int) -> None:
        """The command of ``slot`` is done (a second release, or a reclaimed one, is a no-op)."""
        if self._slots.pop(slot, None) is not None:
            self._room.set()

    def next_deadline(self) -> float:
        """When the oldest slot would be reclaimed."""
        return min(self._slots.values()) + self.slot_timeout

    async def acquire(self) -> int:
        """Wait for room in the window and take a slot."""
        while True:
            slot = self.try_acquire()
            if slot is not None:
                return slot
            self._room = trio.Event()
            with trio.move_on_at(self.next_deadline()):
                await self._room.wait()
