"""Garbage-collection pauses are measured; tuning freezes start-up and sets thresholds."""

from __future__ import annotations

import functools
import gc
import logging
from collections.abc import Iterator

import pytest
import trio
import trio.testing

from migratory.config import Config, ConfigError
from migratory.server import gc_pauses
from migratory.server.gc_pauses import GcPauses, tune


def test_every_collection_is_timed_and_full_ones_counted() -> None:
    pauses = GcPauses()
    pauses.install()
    try:
        gc.collect(0)
        gc.collect(2)
    finally:
        pauses.uninstall()
    assert pauses.stats.collections >= 2 and pauses.stats.full_collections >= 1
    assert pauses.stats.max_ms > 0


def test_a_long_pause_is_logged(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setattr(gc_pauses, "LONG_PAUSE_SECONDS", 0.0)
    pauses = GcPauses()
    pauses.install()
    try:
        with caplog.at_level(logging.INFO, logger="migratory.gc"):
            gc.collect(2)
    finally:
        pauses.uninstall()
    assert pauses.stats.long_pauses >= 1
    assert "garbage collection (generation 2) paused the server" in caplog.text


def test_tune_sets_the_thresholds_and_freezes() -> None:
    before = gc.get_threshold()
    try:
        tune((12345, 7, 9))
        assert gc.get_threshold() == (12345, 7, 9)
        assert gc.get_freeze_count() > 0
    finally:
        gc.unfreeze()
        gc.set_threshold(*before)


def test_gc_thresholds_key_is_validated() -> None:
    assert Config.from_mapping({"GcThresholds": "700, 10, 10"}).gc_thresholds == (700, 10, 10)
    with pytest.raises(ConfigError, match="GcThresholds"):
        Config.from_mapping({"GcThresholds": "700,10"})
    with pytest.raises(ConfigError, match="GcThresholds"):
        Config.from_mapping({"GcThresholds": "0,10,10"})


@pytest.fixture
def no_automatic_collections() -> Iterator[None]:
    """Only the collections a test asks for (and the collector under test runs)."""
    gc.disable()
    try:
        yield
    finally:
        gc.enable()


async def _run_collector(activity: list[int], seconds: float) -> gc_pauses.GcPauseStatistics:
    stats = gc_pauses.GcPauseStatistics()
    with trio.move_on_after(seconds):
        await gc_pauses.collect_when_idle(lambda: activity[0], stats)
    return stats


def _run(activity: list[int], seconds: float, *, busy: bool) -> gc_pauses.GcPauseStatistics:
    async def main() -> gc_pauses.GcPauseStatistics:
        async with trio.open_nursery() as nursery:
            if busy:
                async def publish() -> None:
                    while True:
                        activity[0] += 1
                        await trio.sleep(0.1)
                nursery.start_soon(publish)
            stats = await _run_collector(activity, seconds)
            nursery.cancel_scope.cancel()
        return stats

    return trio.run(main, clock=trio.testing.MockClock(autojump_threshold=0))


@pytest.mark.usefixtures("no_automatic_collections")
def test_an_idle_server_runs_the_pending_full_collection_once() -> None:
    gc.collect(1)  # a generation-1 collection since the last full one: one is pending
    stats = _run([0], 3.5, busy=False)
    assert stats.idle_collections == 1  # then nothing is pending any more
    assert gc.get_count()[2] == 0


@pytest.mark.usefixtures("no_automatic_collections")
def test_a_busy_server_is_left_to_the_collector_s_own_schedule() -> None:
    gc.collect(1)
    stats = _run([0], 3.5, busy=True)
    assert stats.idle_collections == 0
    assert gc.get_count()[2] > 0


@pytest.mark.usefixtures("no_automatic_collections")
def test_nothing_pending_nothing_done() -> None:
    gc.collect()
    stats = _run([0], 3.5, busy=False)
    assert stats.idle_collections == 0


@pytest.mark.usefixtures("no_automatic_collections")
def test_a_server_not_ready_is_not_idle() -> None:
    """A cluster member receiving a cache sync publishes nothing, but what it takes in
    is all alive: a full collection each second walked it all again (100-370 ms each on
    a joiner taking 580,000 messages). Once it is ready, the pending one runs."""
    gc.collect(1)
    ready = [False]
    stats = gc_pauses.GcPauseStatistics()

    async def main() -> None:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(functools.partial(
                gc_pauses.collect_when_idle, lambda: 0, stats, ready=lambda: ready[0]
            ))
            await trio.sleep(3.5)
            assert stats.idle_collections == 0 and gc.get_count()[2] > 0
            ready[0] = True
            await trio.sleep(3)
            nursery.cancel_scope.cancel()

    trio.run(main, clock=trio.testing.MockClock(autojump_threshold=0))
    assert stats.idle_collections == 1
