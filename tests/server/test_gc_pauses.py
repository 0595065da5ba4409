"""Garbage-collection pauses are measured; tuning freezes start-up and sets thresholds."""

from __future__ import annotations

import gc
import logging

import pytest

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
