"""Failures for want of a descriptor, said once then counted (migratory/server/exhaustion.py):
lines counted against a clock the test moves."""

from __future__ import annotations

import errno
import logging

import pytest

from migratory.server.exhaustion import LOG_EVERY, Exhaustion, remedy

EMFILE = OSError(errno.EMFILE, "Too many open files")


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def lines(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name == "test.exhaustion"]


def exhaustion(clock: Clock) -> Exhaustion:
    return Exhaustion(logging.getLogger("test.exhaustion"), "cluster link port 0.0.0.0:9001",
                      clock=clock)


def test_a_long_exhaustion_is_one_line_per_interval_with_a_count_then_one_when_over(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.INFO)
    clock = Clock()
    loop = exhaustion(clock)
    for _ in range(1000):  # 100 s of retries every 0.1 s
        loop.failed(EMFILE)
        clock.now += 0.1
    loop.succeeded()
    said = lines(caplog)
    assert len(said) == 100 // LOG_EVERY + 2  # t=0, 30, 60, 90; "working again"
    assert said[0].startswith("cluster link port 0.0.0.0:9001: cannot accept a connection: "
                              "EMFILE (Too many open files); this process has no file")
    assert "ulimit -n" in said[0] and "LimitNOFILE" in said[0]
    assert "300 times since the last such line" in said[1]
    assert said[-1].startswith("cluster link port 0.0.0.0:9001: working again after 1000 "
                               "failures over 100.0 s")
    assert loop.failures == 1000 and not loop.exhausted
    assert all(r.levelno == logging.WARNING and not r.exc_info for r in caplog.records)


def test_failures_between_successes_are_held_to_the_same_interval(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A process at the edge of its limit: one accept fails, the next succeeds."""
    caplog.set_level(logging.INFO)
    clock = Clock()
    loop = exhaustion(clock)
    for _ in range(600):  # 60 s
        loop.failed(EMFILE)
        clock.now += 0.05
        loop.succeeded()
        clock.now += 0.05
    said = lines(caplog)
    assert len(said) == 4, said  # t=0 and t=30: each its failure line and "working again"
    assert "301 times since the last such line" in said[2]  # t=0.1 to t=30.1


def test_a_loop_that_never_failed_says_nothing(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO)
    loop = exhaustion(Clock())
    for _ in range(10):
        loop.succeeded()
    assert lines(caplog) == [] and loop.failures == 0


def test_each_cause_says_what_to_do() -> None:
    assert "ulimit -n" in remedy(errno.EMFILE)
    assert "fs.file-max" in remedy(errno.ENFILE)
    assert "memory" in remedy(errno.ENOBUFS) and "memory" in remedy(errno.ENOMEM)
