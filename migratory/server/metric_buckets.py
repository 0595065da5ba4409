"""Cheap bucket counts for the server's Prometheus histograms (:mod:`migratory.server.metrics`
turns them into metric families only when Prometheus scrapes): one ``bisect`` and two
additions per observation, once per publish or per socket write, never per subscriber."""

from __future__ import annotations

from bisect import bisect_left

# seconds: publish -> fan-out, publish -> acknowledgement, Raft commit
LATENCY_BOUNDS = (
    0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0,
)
BATCH_BOUNDS = (1, 2, 4, 8, 16, 32, 64, 128, 256, 1024)  # frames in one socket write


class Buckets:
    """Observations counted per bucket, for a Prometheus histogram.

    No lock: every observation happens on the trio thread. ``bounds`` are the upper
    bounds (inclusive, as Prometheus' ``le``); one more bucket counts the rest.
    """

    __slots__ = ("bounds", "counts", "sum")

    def __init__(self, bounds: tuple[float, ...]) -> None:
        self.bounds = bounds
        self.counts = [0] * (len(bounds) + 1)
        self.sum = 0.0

    def observe(self, value: float) -> None:
        self.counts[bisect_left(self.bounds, value)] += 1
        self.sum += value

    @property
    def count(self) -> int:
        return sum(self.counts)


class BatchSizes:
    """Frames per socket write, counted on the write path at the lowest cost: one list
    slot per size (``sizes[n] += 1``, ~0.1 us), grouped into :data:`BATCH_BOUNDS`
    buckets only when Prometheus scrapes."""

    __slots__ = ("large_count", "large_sum", "sizes")

    LIMIT = BATCH_BOUNDS[-1]

    def __init__(self) -> None:
        self.sizes = [0] * (self.LIMIT + 1)  # sizes[n]: writes of n frames, n <= LIMIT
        self.large_count = 0  # writes of more than LIMIT frames
        self.large_sum = 0

    def observe(self, frames: int) -> None:
        if frames <= self.LIMIT:
            self.sizes[frames] += 1
        else:
            self.large_count += 1
            self.large_sum += frames

    @property
    def count(self) -> int:
        return sum(self.sizes) + self.large_count

    def buckets(self) -> Buckets:
        grouped = Buckets(BATCH_BOUNDS)
        for frames, count in enumerate(self.sizes):
            if count:
                grouped.counts[bisect_left(BATCH_BOUNDS, frames)] += count
                grouped.sum += frames * count
        grouped.counts[-1] += self.large_count
        grouped.sum += self.large_sum
        return grouped
