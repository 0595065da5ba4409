"""A supervisor stopped while its workers start: the stop is what it does from then on.

The supervisor waits up to START_TIMEOUT (60 s) for every worker's first ``listening``
lines, and fails (exit 1, "the workers were not ready within 60 s") when they do not
come. A stop signal during start-up sends every worker SIGTERM and waits for them --
up to STOP_GRACE + DrainTime (35 s by default) for one that does not go (hung,
SIGSTOPped, busy). Before, the start-up wait still ran meanwhile: a stop that began at
26 s and waited for such a worker ended, at 60 s, as a start-up failure (exit 1, that
message) instead of the stop asked for (exit 0).
"""

from __future__ import annotations

import trio
import trio.testing

from cluster.workers import START_TIMEOUT, STOP_GRACE, Supervisor
from migratory.config import load_config


def test_a_stop_during_start_up_that_outlasts_the_start_timeout_is_not_a_failure() -> None:
    config = load_config(overrides={"Listen": "127.0.0.1:0", "Workers": "2"}, environ={})
    supervisor = Supervisor(config, [])
    supervisor.slots[0].ready.set()  # worker 1 never says it listens (it hangs)
    signalled_at = START_TIMEOUT - 34
    stop_lasts = STOP_GRACE + config.drain_time  # the hung worker waited for, then killed

    async def main() -> None:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(supervisor._announce_when_ready)
            await trio.sleep(signalled_at)
            supervisor.stopping = True  # (Supervisor._stop, as a signal starts it)
            await trio.sleep(stop_lasts)
            nursery.cancel_scope.cancel()  # the stop is done (Supervisor.run)

    assert signalled_at + stop_lasts > START_TIMEOUT  # (the case: the stop outlasts it)
    trio.run(main, clock=trio.testing.MockClock(autojump_threshold=0))
    assert not supervisor.announced


def test_workers_not_ready_within_the_start_timeout_still_fail_the_start() -> None:
    config = load_config(overrides={"Listen": "127.0.0.1:0", "Workers": "2"}, environ={})
    supervisor = Supervisor(config, [])
    supervisor.slots[0].ready.set()

    async def main() -> None:
        await supervisor._announce_when_ready()

    try:
        trio.run(main, clock=trio.testing.MockClock(autojump_threshold=0))
    except trio.TooSlowError:
        return
    raise AssertionError("a start-up that never ended did not fail")
