"""Giving freed memory back to the system after clients leave.

glibc keeps the heap pages of freed objects for reuse: after many connections holding
large buffers (incomplete frames, outboxes) close, the server's RSS stays where the
attack left it. ``malloc_trim(0)`` returns the free pages; :class:`MemoryTrim` calls it
at most every ``TRIM_INTERVAL`` seconds, and only after connections closed. Elsewhere
than glibc it does nothing.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import logging
from collections.abc import Callable

log = logging.getLogger("migratory.memory")

TRIM_INTERVAL = 2.0
CLOSED_BEFORE_TRIM = 16
"""Connections closed since the last trim before another one is worth its cost."""
FORGOTTEN_BEFORE_TRIM = 16_000
"""Subjects forgotten since the last trim before another one is worth its cost."""


def _malloc_trim() -> Callable[[int], int] | None:
    name = ctypes.util.find_library("c")
    if name is None:
        return None
    try:
        trim: Callable[[int], int] = ctypes.CDLL(name).malloc_trim
    except (OSError, AttributeError):
        return None
    return trim


class MemoryTrim:
    __slots__ = ("_closed", "_forgotten", "_last", "_trim")

    def __init__(self) -> None:
        self._trim = _malloc_trim()
        self._closed = 0
        self._forgotten = 0
        self._last = float("-inf")

    def closed(self) -> None:
        """A connection closed."""
        self._closed += 1

    def forgot(self, subjects: int) -> None:
        """The hub forgot ``subjects`` subjects."""
        self._forgotten += subjects

    def maybe_trim(self, now: float) -> bool:
        """Trim when enough connections closed since the last trim; True if it did."""
        if self._trim is None or now - self._last < TRIM_INTERVAL:
            return False
        if self._closed < CLOSED_BEFORE_TRIM and self._forgotten < FORGOTTEN_BEFORE_TRIM:
            return False
        self._closed = self._forgotten = 0
        self._last = now
        self._trim(0)
        return True
