"""Event-loop gaps: how long the server's loop was kept from running a ready task.

A task that asks to wake every :data:`PROBE_SECONDS` measures how late it wakes; the
lateness is the time the loop spent on something else without yielding (a long fan-out
pass, a garbage collection, a sweep over every subject). Any client whose data was ready
then waited that long too, so the largest gap is the "longest stall" of a benchmark.

:class:`LoopGaps` is pure bookkeeping with the clock passed in (tests drive it); it keeps
the largest gap of each of the last :data:`KEEP_SECONDS` seconds, by ``time.monotonic``
second (one clock for every process on the machine, so a benchmark can ask for the
largest gap inside its own measuring window), plus totals since start.
"""

from __future__ import annotations

import time
from collections import deque
from typing import Any

import trio

PROBE_SECONDS = 0.005
KEEP_SECONDS = 300
LONG_GAP_SECONDS = 0.05


class LoopGaps:
    """The largest loop gap per second, for the last :data:`KEEP_SECONDS` seconds."""

    def __init__(self, keep: int = KEEP_SECONDS) -> None:
        self._seconds: deque[tuple[int, float]] = deque(maxlen=keep)  # (second, max gap)
        self.max_ms = 0.0
        self.long_gaps = 0
        self.probes = 0

    def record(self, now: float, gap: float) -> None:
        """The probe woke at ``now`` (``time.monotonic``), ``gap`` seconds late."""
        self.probes += 1
        gap_ms = max(0.0, gap) * 1000
        second = int(now)
        if self._seconds and self._seconds[-1][0] == second:
            if gap_ms > self._seconds[-1][1]:
                self._seconds[-1] = (second, gap_ms)
        else:
            self._seconds.append((second, gap_ms))
        if gap_ms > self.max_ms:
            self.max_ms = gap_ms
        if gap >= LONG_GAP_SECONDS:
            self.long_gaps += 1

    def max_between(self, start: float, end: float) -> float | None:
        """The largest gap (ms) seen in whole seconds from ``start`` to ``end``."""
        inside = [gap for second, gap in self._seconds if int(start) <= second <= int(end)]
        return max(inside) if inside else None

    def statistics(self) -> dict[str, Any]:
        return {
            "probe_ms": PROBE_SECONDS * 1000,
            "max_ms": round(self.max_ms, 3),
            "long_gaps": self.long_gaps,
            "probes": self.probes,
            # [monotonic second, largest gap in it (ms)], oldest first
            "per_second": [[second, round(gap, 3)] for second, gap in self._seconds],
        }


async def probe(gaps: LoopGaps) -> None:
    """Wake every :data:`PROBE_SECONDS` and record how late each wake-up was."""
    while True:
        due = time.monotonic() + PROBE_SECONDS
        await trio.sleep(PROBE_SECONDS)
        now = time.monotonic()
        gaps.record(now, now - due)
