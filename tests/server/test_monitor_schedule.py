"""The monitor's rounds run on an absolute schedule: a push every MonitorPushInterval
seconds exactly, however long a round takes (the dashboard promises an update at least
every 2 s with the default 2), and a late round skips what it missed instead of
bunching up."""

from __future__ import annotations

from types import SimpleNamespace

import trio
import trio.testing

from migratory.config import Config
from migratory.server.monitor import Monitor


class TimedMonitor(Monitor):
    """Records when it samples and pushes (the tests make a round cost clock time)."""

    def __init__(self, interval: int, round_cost: float) -> None:
        config = Config.from_mapping({"MonitorToken": "t", "MonitorPushInterval": str(interval)})
        super().__init__(SimpleNamespace(config=config))  # type: ignore[arg-type]
        self.round_cost = round_cost
        self.samples: list[float] = []
        self.pushes: list[float] = []

    def sample(self, now: float) -> None:
        self.samples.append(trio.current_time())

    def push(self, now: float) -> int:
        self.pushes.append(now)
        return 1


async def run_for(monitor: TimedMonitor, seconds: float) -> None:
    with trio.move_on_after(seconds):
        await monitor.run()


def test_pushes_every_interval_exactly_whatever_a_round_costs() -> None:
    clock = trio.testing.MockClock(autojump_threshold=0)
    monitor = TimedMonitor(interval=2, round_cost=0.3)
    original = monitor.sample

    def slow_sample(now: float) -> None:
        original(now)
        clock.jump(monitor.round_cost)

    monitor.sample = slow_sample  # type: ignore[method-assign]
    trio.run(run_for, monitor, 20.5, clock=clock)
    start = monitor.pushes[0] - 2
    assert [round(p - start, 6) for p in monitor.pushes] == [2.0 * i for i in range(1, 11)]
    assert len(monitor.samples) == 20


def test_a_late_round_skips_the_slots_it_missed() -> None:
    clock = trio.testing.MockClock(autojump_threshold=0)
    monitor = TimedMonitor(interval=2, round_cost=0.0)
    original = monitor.sample

    def stalls_once(now: float) -> None:
        original(now)
        if len(monitor.samples) == 3:
            clock.jump(4.5)  # one round stalls 4.5 s (a GC pause, a busy machine)

    monitor.sample = stalls_once  # type: ignore[method-assign]
    trio.run(run_for, monitor, 12.2, clock=clock)
    start = monitor.pushes[0] - 2
    # the push due at 4 and 6 happens once, late (7.5); then back on the 2 s grid
    assert [round(p - start, 6) for p in monitor.pushes] == [2.0, 7.5, 8.0, 10.0, 12.0]
