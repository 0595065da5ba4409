"""Garbage-collection pauses: measured, and made rare.

CPython's cyclic garbage collector stops the whole process while it scans; a
full (generation 2) collection over a member's heap -- caches, the Raft log,
trio's and pysyncobj's own objects -- took 20-60 ms on this machine and was the
p99.9 of acknowledgement latency (docs/benchmarks.md). :func:`tune` moves
everything alive after start-up out of the collector's sight (``gc.freeze``:
those objects are never scanned again; reference counting still frees them) and
sets the thresholds from ``GcThresholds``, so full collections come minutes
apart instead of seconds. :class:`GcPauses` measures every collection through
``gc.callbacks`` and logs the long ones, so an operator sees a stall's cause.

A full collection walks every tracked object: ~40 per connection, so ~190 ms at
10,000 connections. CPython starts one when the objects promoted since the last one
pass a quarter of the long-lived heap -- typically just after a burst of new
connections, once messages flow again. :func:`collect_when_idle` runs that collection
early, in a second in which the server received, published and fanned out nothing
(``Server.activity``: a publish waiting for a late Raft commit is activity too), so the
pause falls where no message waits for it; after it, the next full collection
needs the heap to grow by another quarter.
"""

from __future__ import annotations

import gc
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import trio

log = logging.getLogger("migratory.gc")

LONG_PAUSE_SECONDS = 0.025


@dataclass(slots=True)
class GcPauseStatistics:
    collections: int = 0
    full_collections: int = 0
    total_ms: float = 0.0
    max_ms: float = 0.0
    long_pauses: int = 0
    idle_collections: int = 0


class GcPauses:
    """Times every garbage collection (install once per process)."""

    def __init__(self) -> None:
        self.stats = GcPauseStatistics()
        self._started: float | None = None

    def install(self) -> None:
        if self._callback not in gc.callbacks:
            gc.callbacks.append(self._callback)

    def uninstall(self) -> None:
        if self._callback in gc.callbacks:
            gc.callbacks.remove(self._callback)

    def __enter__(self) -> GcPauses:
        """Installed while the server runs: a collection after it stopped (the error
        path, the interpreter's exit) is not one of its pauses, nor logged."""
        self.install()
        return self

    def __exit__(self, *exc: object) -> None:
        self.uninstall()

    def _callback(self, phase: str, info: dict[str, Any]) -> None:
        if phase == "start":
            self._started = time.perf_counter()
            return
        if self._started is None:
            return
        pause = time.perf_counter() - self._started
        self._started = None
        stats = self.stats
        stats.collections += 1
        stats.total_ms += pause * 1000
        stats.max_ms = max(stats.max_ms, pause * 1000)
        if info.get("generation") == 2:
            stats.full_collections += 1
        if pause >= LONG_PAUSE_SECONDS:
            stats.long_pauses += 1
            log.info("garbage collection (generation %s) paused the server for %.0f ms",
                     info.get("generation"), pause * 1000)


def tune(thresholds: tuple[int, int, int], *, pauses: GcPauses | None = None) -> None:
    """Freeze what start-up allocated and set the collector's thresholds. The full
    collection before the freeze is start-up's own, before the server says it listens:
    ``pauses`` does not time it. It was logged at every start as a stall ('garbage
    collection (generation 2) paused the server for 55 ms', the second line a new user
    read) and stood as the ``gc`` ``max_ms`` of /stats until a real pause passed it."""
    if pauses is not None:
        pauses.uninstall()
    try:
        gc.collect()
        gc.freeze()
    finally:
        if pauses is not None:
            pauses.install()
    gc.set_threshold(*thresholds)


IDLE_CHECK_SECONDS = 1.0


async def collect_when_idle(
    activity: Callable[[], int],
    stats: GcPauseStatistics,
    *,
    every: float = IDLE_CHECK_SECONDS,
    ready: Callable[[], bool] = lambda: True,
) -> None:
    """Run a full collection in each ``every``-second interval in which ``activity()``
    did not change, if at least one generation-1 collection happened since the last full
    one (else there is nothing new to promote, and nothing is done).

    Not while ``ready()`` is false: a cluster member joining or syncing its cache
    publishes nothing, but its heap grows with what it takes in, all of it alive, and a
    full collection each second walked it all again (100-370 ms a second on a member
    receiving a 580,000-message cache sync, docs/benchmarks.md)."""
    last = activity()
    while True:
        await trio.sleep(every)
        now = activity()
        if now == last and ready() and gc.get_count()[2] > 0:
            started = time.perf_counter()
            gc.collect()
            stats.idle_collections += 1
            log.info("full garbage collection while idle: %.0f ms",
                     (time.perf_counter() - started) * 1000)
        last = activity()
