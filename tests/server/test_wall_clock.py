"""The wall clock's steps are said (migratory/server/wall_clock.py, both clocks injected):
an NTP step, a VM resumed, a clock set by hand; a slew is not a step."""

from __future__ import annotations

import logging

import pytest

from migratory.server.wall_clock import STEP_SECONDS, WallClockWatch

HOUR, DAY = 3600.0, 86400.0


def test_a_slew_is_no_step() -> None:
    wall, monotonic = [1_800_000_000.0], [500.0]
    watch = WallClockWatch(wall=lambda: wall[0], monotonic=lambda: monotonic[0])
    for _ in range(100):  # 100 s at the fastest slew NTP makes (500 ppm)
        wall[0] += 1.0005
        monotonic[0] += 1.0
        assert watch.check() == 0.0
    wall[0] += 1.0 + STEP_SECONDS  # the bound itself: no step
    monotonic[0] += 1.0
    assert watch.check() == 0.0
    wall[0] += 1.0 + STEP_SECONDS + 0.01  # just over it
    monotonic[0] += 1.0
    assert watch.check() == pytest.approx(STEP_SECONDS + 0.01)


@pytest.mark.parametrize("step", [HOUR, -HOUR, DAY])
def test_a_step_is_said_with_its_size_and_what_it_does(
    step: float, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="migratory.clock")
    wall, monotonic = [1_800_000_000.0], [500.0]
    watch = WallClockWatch(wall=lambda: wall[0], monotonic=lambda: monotonic[0])
    wall[0] += 1.0 + step
    monotonic[0] += 1.0
    assert watch.check() == pytest.approx(step)
    wall[0] += 1.0
    monotonic[0] += 1.0
    assert watch.check() == 0.0  # said once
    [line] = [r.getMessage() for r in caplog.records]
    way = "forward" if step > 0 else "back"
    assert line.startswith(f"the wall clock stepped {way} {abs(step):.1f} s against the "
                           "monotonic clock (an NTP correction")
    assert ("tokens whose exp it passed are expired" if step > 0 else
            "tokens that expired within the step are accepted again") in line


def test_the_server_looks_once_a_second_and_counts_the_steps() -> None:
    """The server's tick loop (app.py) looks every EXPIRE_EVERY_TICKS: a step of an hour
    is counted once in wall_clock_steps (GET /stats, migratory_wall_clock_steps_total)."""
    import trio
    import trio.testing

    from migratory.config import load_config
    from migratory.server.app import Server

    server = Server(load_config(overrides={"Listen": "127.0.0.1:0"}, environ={}))
    wall = [1_800_000_000.0]

    async def main() -> None:
        server._wall_clock = WallClockWatch(
            wall=lambda: wall[0] + trio.current_time(), monotonic=trio.current_time)
        async with trio.open_nursery() as nursery:
            nursery.start_soon(server._tick_loop)
            await trio.sleep(2.05)
            wall[0] += HOUR
            await trio.sleep(3)
            nursery.cancel_scope.cancel()

    trio.run(main, clock=trio.testing.MockClock(autojump_threshold=0))
    assert server.ctx.stats.wall_clock_steps == 1
