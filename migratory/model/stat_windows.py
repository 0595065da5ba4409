"""Statistics windows: max, average and standard deviation of an indicator over the
last 1, 5 and 15 minutes, 1 hour and 1 day, as MigratoryData keeps them.

Pure code: values and times come in, figures come out; the caller owns the clock
(tests drive it with a fake one). Memory and work do not grow with the window: a
window of ``span`` seconds is a ring of :data:`SLOTS` slots of ``span / SLOTS``
seconds, each holding the count, sum, sum of squares and maximum of the samples that
fell in it. A window's figures merge the slots that started within the last
``span`` seconds, so they cover between ``span - slot`` and ``span`` seconds of
samples (the oldest slot leaves whole).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass

__all__ = [
    "SLOTS",
    "WINDOWS",
    "IndicatorWindows",
    "StatisticsWindows",
    "Window",
    "WindowFigures",
]

SLOTS = 60
# (name, seconds): the periods MigratoryData reports
WINDOWS: tuple[tuple[str, float], ...] = (
    ("1m", 60.0),
    ("5m", 300.0),
    ("15m", 900.0),
    ("1h", 3600.0),
    ("1d", 86400.0),
)


@dataclass(frozen=True, slots=True)
class WindowFigures:
    """One indicator over one window; all None when no sample fell in it."""

    samples: int
    max: float | None
    avg: float | None
    stddev: float | None

    def as_dict(self) -> dict[str, float | int | None]:
        return {"samples": self.samples, "max": self.max, "avg": self.avg, "stddev": self.stddev}


_EMPTY = WindowFigures(0, None, None, None)


class _Slot:
    __slots__ = ("count", "index", "max", "sum", "sum_squares")

    def __init__(self) -> None:
        self.index = -1  # which slot of time it holds (time // slot length); -1: none
        self.count = 0
        self.sum = 0.0
        self.sum_squares = 0.0
        self.max = -math.inf

    def reset(self, index: int) -> None:
        self.index = index
        self.count = 0
        self.sum = 0.0
        self.sum_squares = 0.0
        self.max = -math.inf


class Window:
    """Samples of one indicator over the last ``span`` seconds, in :data:`SLOTS` slots."""

    __slots__ = ("_slot_seconds", "_slots", "span")

    def __init__(self, span: float, slots: int = SLOTS) -> None:
        if span <= 0 or slots < 1:
            raise ValueError(f"a window needs span > 0 and slots >= 1, got {span}, {slots}")
        self.span = span
        self._slot_seconds = span / slots
        self._slots = [_Slot() for _ in range(slots)]

    def add(self, value: float, now: float) -> None:
        index = int(now // self._slot_seconds)
        slot = self._slots[index % len(self._slots)]
        if slot.index != index:
            slot.reset(index)
        slot.count += 1
        slot.sum += value
        slot.sum_squares += value * value
        if value > slot.max:
            slot.max = value

    def figures(self, now: float) -> WindowFigures:
        current = int(now // self._slot_seconds)
        oldest = current - len(self._slots) + 1
        count = 0
        total = 0.0
        squares = 0.0
        highest = -math.inf
        for slot in self._slots:
            if oldest <= slot.index <= current and slot.count:
                count += slot.count
                total += slot.sum
                squares += slot.sum_squares
                highest = max(highest, slot.max)
        if not count:
            return _EMPTY
        mean = total / count
        variance = max(squares / count - mean * mean, 0.0)  # population; rounding < 0
        return WindowFigures(count, highest, mean, math.sqrt(variance))


class IndicatorWindows:
    """One indicator over every period of :data:`WINDOWS`."""

    __slots__ = ("_windows",)

    def __init__(self, windows: tuple[tuple[str, float], ...] = WINDOWS) -> None:
        self._windows = {name: Window(span) for name, span in windows}

    def add(self, value: float, now: float) -> None:
        for window in self._windows.values():
            window.add(value, now)

    def figures(self, now: float) -> dict[str, WindowFigures]:
        return {name: window.figures(now) for name, window in self._windows.items()}


class StatisticsWindows:
    """The windows of several named indicators, sampled together.

    ``sample({"clients": 12, "latency_ms": None}, now)``: a None value (no
    observation in that interval, e.g. no publish, so no latency) is not a sample.
    """

    def __init__(
        self, indicators: tuple[str, ...], windows: tuple[tuple[str, float], ...] = WINDOWS
    ) -> None:
        self.indicators = indicators
        self._by_name = {name: IndicatorWindows(windows) for name in indicators}

    def sample(self, values: Mapping[str, float | None], now: float) -> None:
        unknown = set(values) - set(self._by_name)
        if unknown:
            raise KeyError(f"unknown indicators {sorted(unknown)}")
        for name, value in values.items():
            if value is not None:
                self._by_name[name].add(float(value), now)

    def report(self, now: float) -> dict[str, dict[str, dict[str, float | int | None]]]:
        """``{indicator: {window: {samples, max, avg, stddev}}}``, JSON-ready."""
        return {
            name: {period: f.as_dict() for period, f in windows.figures(now).items()}
            for name, windows in self._by_name.items()
        }


class RateMeter:
    """Turns ever-growing counters into per-second rates between two readings."""

    __slots__ = ("_last", "_last_time")

    def __init__(self) -> None:
        self._last: dict[str, float] = {}
        self._last_time: float | None = None

    def rates(self, counters: Mapping[str, float], now: float) -> dict[str, float | None]:
        """Per-second rates since the previous call (None for each on the first call, or
        when no time passed). A counter that went down (a restart) counts from zero."""
        previous, then = self._last, self._last_time
        self._last, self._last_time = dict(counters), now
        if then is None or now <= then:
            return {name: None for name in counters}
        elapsed = now - then
        out: dict[str, float | None] = {}
        for name, value in counters.items():
            before = previous.get(name, 0.0)
            out[name] = (value - before if value >= before else value) / elapsed
        return out
