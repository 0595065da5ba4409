"""Event-loop gaps: how long the server's loop was kept from running a ready task.

A task that asks to wake every :data:`PROBE_SECONDS` measures how late it wakes; the
lateness is the time the loop spent on something else without yielding (a long fan-out
pass, a garbage collection, a sweep over every subject). Any client whose data was ready
then waited that long too, so the largest gap is the "longest stall" of a benchmark.
A loop idle for a second is probed every :data:`IDLE_PROBE_SECONDS` instead, until a
wake-up finds it busy or late.

:class:`LoopGaps` is pure bookkeeping with the clock passed in (tests drive it); it keeps
the largest gap of each of the last :data:`KEEP_SECONDS` seconds, by ``time.monotonic``
second (one clock for every process on the machine, so a benchmark can ask for the
largest gap inside its own measuring window), plus totals since start.

What a long gap was made of (:class:`GapParts`, issue 13: "find what stops the loop"):
the probe samples, at each wake-up, the loop thread's CPU time and the time it was
runnable but not running (Linux ``/proc/thread-self/schedstat``: one ``pread``), the
process's CPU time (its other threads: pysyncobj's Raft thread holds the GIL while it
runs Python) and the wall time of garbage collections (``gc.callbacks``). A gap of a busy
loop is mostly loop CPU (a long pass, a collection the loop ran); of an overloaded
machine, waiting for a core; of another thread, its CPU. On a shared 2-core machine the
seeds' fill gaps were 60-85 % waiting for a core (docs/benchmarks.md).
"""

from __future__ import annotations

import gc
import os
import time
from collections import deque
from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import Any

import trio

PROBE_SECONDS = 0.005
IDLE_PROBE_SECONDS = 0.025
"""The probe's period once the loop has been idle for :data:`IDLE_AFTER_SECONDS`: 200
wake-ups a second were ~24 of the ~55 ms of CPU a second an idle member used (h176,
load 15: 31 ms/s with the probe at 0.1 s). A stall that starts from idle is then
measured from the probe's next due time, up to this much short; the first wake-up that
finds the loop busy or late probes every :data:`PROBE_SECONDS` again."""
IDLE_AFTER_SECONDS = 1.0
IDLE_LOOP_SHARE = 0.1
IDLE_LATE_SECONDS = 0.01
"""Idle: for :data:`IDLE_AFTER_SECONDS`, every wake-up less late than this and the loop
thread's CPU under :data:`IDLE_LOOP_SHARE` of the time. Idle probing ends at the first
wake-up late by this much or after an interval that busy. (An idle server alone on this
VM wakes 1.5-7.5 ms late at most each second, and some 5 ms intervals hold a batch
pass: judged wake-up by wake-up, with 1 ms, it was never idle.)"""
KEEP_SECONDS = 300
LONG_GAP_SECONDS = 0.05


@dataclass(frozen=True, slots=True)
class GapParts:
    """Milliseconds of a probe's interval (its sleep and the gap), by what happened."""

    loop_cpu_ms: float
    """The loop thread ran: its own work, or a collection it ran."""
    waiting_for_core_ms: float
    """The loop thread was runnable and not running: the machine's cores were busy."""
    other_threads_cpu_ms: float
    """The process's other threads ran (the Raft thread, to_thread workers)."""
    gc_ms: float
    """Garbage collections, wall time, in any thread of the process."""

    def __add__(self, other: GapParts) -> GapParts:
        return GapParts(*(a + b for a, b in zip(astuple(self), astuple(other), strict=True)))


def astuple(parts: GapParts) -> tuple[float, float, float, float]:
    return (parts.loop_cpu_ms, parts.waiting_for_core_ms, parts.other_threads_cpu_ms,
            parts.gc_ms)


NO_PARTS = GapParts(0.0, 0.0, 0.0, 0.0)


class LoopClocks:
    """What :class:`GapParts` is measured from, read at each wake-up of the probe; open
    it on the loop thread (``/proc/thread-self`` is the thread that opens it)."""

    def __init__(self) -> None:
        self._schedstat = schedstat_file()
        self._gc_seconds = 0.0
        self._gc_started = 0.0
        gc.callbacks.append(self._collection)

    def close(self) -> None:
        gc.callbacks.remove(self._collection)
        if self._schedstat is not None:
            os.close(self._schedstat)
            self._schedstat = None

    def _collection(self, phase: str, info: dict[str, Any]) -> None:
        if phase == "start":
            self._gc_started = time.perf_counter()
        else:
            self._gc_seconds += time.perf_counter() - self._gc_started

    def read(self) -> tuple[float, float, float, float]:
        """Seconds: the loop thread's CPU, its waiting for a core, the process's CPU, the
        collections' wall time, each since some fixed point."""
        if self._schedstat is not None:
            cpu, waiting = parse_schedstat(os.pread(self._schedstat, 128, 0))
        else:
            cpu, waiting = time.thread_time(), 0.0
        return cpu, waiting, time.process_time(), self._gc_seconds


def schedstat_file() -> int | None:
    """The calling thread's ``schedstat``, open; None where there is none (not Linux) or
    it says nothing (a kernel without schedstats): the loop's CPU is then taken from its
    clock, and its waiting for a core is not measured."""
    try:
        fd = os.open("/proc/thread-self/schedstat", os.O_RDONLY)
    except OSError:
        return None
    try:
        if parse_schedstat(os.pread(fd, 128, 0))[0] > 0:
            return fd
    except (OSError, ValueError):
        pass
    os.close(fd)
    return None


def parse_schedstat(line: bytes) -> tuple[float, float]:
    """``/proc/.../schedstat`` (nanoseconds on a CPU, waiting on a run queue, slices):
    the first two, in seconds."""
    on_cpu, waiting, _ = line.split()
    return int(on_cpu) / 1e9, int(waiting) / 1e9


def parts_between(
    before: tuple[float, float, float, float], after: tuple[float, float, float, float]
) -> GapParts:
    """What happened between two :meth:`LoopClocks.read`."""
    cpu, waiting, process, collections = (b - a for a, b in zip(before, after, strict=True))
    return GapParts(round(cpu * 1e3, 3), round(waiting * 1e3, 3),
                    round(max(0.0, process - cpu) * 1e3, 3), round(collections * 1e3, 3))


class LoopGaps:
    """The largest loop gap per second, for the last :data:`KEEP_SECONDS` seconds."""

    def __init__(self, keep: int = KEEP_SECONDS) -> None:
        self._seconds: deque[tuple[int, float]] = deque(maxlen=keep)  # (second, max gap)
        self.max_ms = 0.0
        self.long_gaps = 0
        self.probes = 0
        self.long_gap_parts = NO_PARTS
        """What the long gaps were made of, summed (those recorded with their parts)."""
        self.longest_parts: GapParts | None = None

    def record(self, now: float, gap: float, parts: GapParts | None = None) -> None:
        """The probe woke at ``now`` (``time.monotonic``), ``gap`` seconds late;
        ``parts``: what its interval was made of (:class:`LoopClocks`)."""
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
            self.longest_parts = parts
        if gap >= LONG_GAP_SECONDS:
            self.long_gaps += 1
            if parts is not None:
                self.long_gap_parts += parts

    def max_between(self, start: float, end: float) -> float | None:
        """The largest gap (ms) seen in whole seconds from ``start`` to ``end``."""
        inside = [gap for second, gap in self._seconds if int(start) <= second <= int(end)]
        return max(inside) if inside else None

    def statistics(self) -> dict[str, Any]:
        return {
            "probe_ms": PROBE_SECONDS * 1000,
            "idle_probe_ms": IDLE_PROBE_SECONDS * 1000,
            "max_ms": round(self.max_ms, 3),
            "long_gaps": self.long_gaps,
            "long_gap_parts_ms": asdict(self.long_gap_parts),  # summed over long gaps
            "longest_gap_parts_ms": None if self.longest_parts is None
            else asdict(self.longest_parts),
            "probes": self.probes,
            # [monotonic second, largest gap in it (ms)], oldest first
            "per_second": [[second, round(gap, 3)] for second, gap in self._seconds],
        }


async def probe(gaps: LoopGaps, *, clock: Callable[[], float] = time.monotonic) -> None:
    """Wake every :data:`PROBE_SECONDS` (:data:`IDLE_PROBE_SECONDS` while the loop is
    idle) and record how late each wake-up was, and what the interval was made of.
    ``clock``: the loop's clock (tests: trio's, mocked)."""
    clocks = LoopClocks()
    try:
        before = clocks.read()
        period = PROBE_SECONDS
        window, window_cpu, late = clock(), before[0], False
        while True:
            started = clock()
            due = started + period
            await trio.sleep(period)
            now = clock()
            after, gap = clocks.read(), now - due
            if gap >= LONG_GAP_SECONDS or gap * 1000 > gaps.max_ms:  # (the usual: neither)
                gaps.record(now, gap, parts_between(before, after))
            else:
                gaps.record(now, gap)
            late = late or gap >= IDLE_LATE_SECONDS
            busy = after[0] - before[0] >= IDLE_LOOP_SHARE * (now - started)
            if period == IDLE_PROBE_SECONDS and (late or busy):
                period, window, window_cpu, late = PROBE_SECONDS, now, after[0], False
            elif now - window >= IDLE_AFTER_SECONDS:
                share = (after[0] - window_cpu) / (now - window)
                idle = share < IDLE_LOOP_SHARE and not late
                period = IDLE_PROBE_SECONDS if idle else PROBE_SECONDS
                window, window_cpu, late = now, after[0], False
            before = after
    finally:
        clocks.close()
