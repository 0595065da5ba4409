"""Statistics windows with a fake clock: max, avg, stddev over 1 m ... 1 d."""

from __future__ import annotations

import math
import statistics

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from migratory.model.stat_windows import (
    SLOTS,
    WINDOWS,
    RateMeter,
    StatisticsWindows,
    Window,
)


def test_the_periods_are_migratorydatas() -> None:
    assert [name for name, _ in WINDOWS] == ["1m", "5m", "15m", "1h", "1d"]
    assert [span for _, span in WINDOWS] == [60, 300, 900, 3600, 86400]


def test_max_average_and_population_stddev_of_the_samples() -> None:
    window = Window(60)
    values = [3.0, 7.0, 7.0, 19.0, 4.0]
    for second, value in enumerate(values):
        window.add(value, 1000.0 + second)
    figures = window.figures(1000.0 + len(values))
    assert figures.samples == 5
    assert figures.max == 19.0
    assert figures.avg == pytest.approx(statistics.fmean(values))
    assert figures.stddev == pytest.approx(statistics.pstdev(values))


def test_a_constant_has_no_deviation_and_an_empty_window_no_figures() -> None:
    window = Window(60)
    assert window.figures(0.0).samples == 0
    assert window.figures(0.0).max is None
    for second in range(30):
        window.add(42.0, float(second))
    figures = window.figures(30.0)
    assert (figures.max, figures.avg, figures.stddev) == (42.0, 42.0, 0.0)


def test_old_samples_leave_the_short_window_but_stay_in_the_long_ones() -> None:
    windows = StatisticsWindows(("clients",))
    windows.sample({"clients": 500.0}, 10.0)  # one spike
    for second in range(11, 400):
        windows.sample({"clients": 10.0}, float(second))
    report = windows.report(400.0)["clients"]
    assert report["1m"]["max"] == 10.0  # the spike is 390 s old
    assert report["5m"]["max"] == 10.0
    assert report["15m"]["max"] == 500.0
    assert report["1h"]["max"] == 500.0
    assert report["1d"]["samples"] == 390
    assert report["1m"]["samples"] in range(55, 61)  # whole slots leave at once


def test_a_window_never_counts_a_sample_older_than_its_span() -> None:
    window = Window(60)
    window.add(1.0, 0.0)
    assert window.figures(59.0).samples == 1
    assert window.figures(60.0).samples == 0  # its slot left the window
    assert window.figures(3600.0).samples == 0  # and stays gone when the ring wraps


def test_a_day_keeps_bounded_memory_and_forgets_the_day_before() -> None:
    windows = StatisticsWindows(("rate",))
    day = 86400.0
    for minute in range(2 * 24 * 60):  # two days, one sample a minute
        windows.sample({"rate": 100.0 if minute < 24 * 60 else 1.0}, minute * 60.0)
    figures = windows.report(2 * day)["rate"]["1d"]
    assert figures["max"] == 1.0
    assert figures["samples"] in range(24 * 60 - 24, 24 * 60 + 1)
    assert len(windows._by_name["rate"]._windows["1d"]._slots) == SLOTS


def test_none_is_no_sample_and_unknown_indicators_are_refused() -> None:
    windows = StatisticsWindows(("latency_ms", "clients"))
    windows.sample({"latency_ms": None, "clients": 3}, 1.0)
    report = windows.report(2.0)
    assert report["latency_ms"]["1m"]["samples"] == 0
    assert report["clients"]["1m"]["samples"] == 1
    with pytest.raises(KeyError, match="bogus"):
        windows.sample({"bogus": 1.0}, 3.0)


def test_rates_per_second_from_counters() -> None:
    meter = RateMeter()
    assert meter.rates({"out": 100.0}, 10.0) == {"out": None}  # nothing to compare with
    assert meter.rates({"out": 300.0}, 12.0) == {"out": 100.0}
    assert meter.rates({"out": 300.0}, 12.0) == {"out": None}  # no time passed
    assert meter.rates({"out": 50.0}, 13.0) == {"out": 50.0}  # restarted: from zero


@settings(max_examples=150, deadline=None)
@given(
    samples=st.lists(
        st.tuples(st.floats(0, 2000), st.floats(-1e6, 1e6, allow_nan=False)), max_size=80
    ),
    span=st.sampled_from([60.0, 300.0]),
    now=st.floats(0, 2400),
)
def test_figures_equal_a_brute_force_over_the_slots_in_the_window(
    samples: list[tuple[float, float]], span: float, now: float
) -> None:
    """The ring's figures equal those computed from every sample kept since the first
    slot of the window (samples come in time order, as the sampler gives them)."""
    samples = sorted(samples)
    samples = [(t, v) for t, v in samples if t <= now]
    window = Window(span)
    for t, value in samples:
        window.add(value, t)
    slot = span / SLOTS
    first = (int(now // slot) - SLOTS + 1) * slot
    kept = [v for t, v in samples if t >= first]
    figures = window.figures(now)
    assert figures.samples == len(kept)
    if kept:
        assert figures.max == max(kept)
        assert figures.avg == pytest.approx(statistics.fmean(kept), rel=1e-9, abs=1e-6)
        expected = statistics.pstdev(kept)
        assert figures.stddev is not None
        assert math.isclose(figures.stddev, expected, rel_tol=1e-6, abs_tol=1e-3 * max(
            1.0, max(abs(v) for v in kept)))
