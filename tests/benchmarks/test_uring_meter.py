"""benchmarks/uring_meter.py: the CPU of the process's other threads, split by kind."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))

from uring_meter import thread_split


def test_other_threads_are_split_by_name_and_the_rest_counted_as_exited() -> None:
    start = {
        10: ("python", 5_000_000_000),  # the loop thread: left out
        11: ("iou-sqp-10", 1_000_000_000),
        12: ("iou-wrk-10", 2_000_000_000),
        13: ("iou-wrk-10", 9_000_000_000),  # exits during the run
    }
    end = {
        10: ("python", 9_000_000_000),
        11: ("iou-sqp-10", 1_500_000_000),
        12: ("iou-wrk-10", 2_250_000_000),
        14: ("iou-wrk-10", 100_000_000),  # new during the run: all of it counts
        15: ("python", 50_000_000),
    }
    split = thread_split(start, end, loop_tid=10, others_s=1.0)
    assert split["iou-sqp"] == pytest.approx(0.5)
    assert split["iou-wrk"] == pytest.approx(0.35)
    assert split["other"] == pytest.approx(0.05)
    assert split["exited"] == pytest.approx(0.1)  # 1.0 - 0.5 - 0.35 - 0.05
