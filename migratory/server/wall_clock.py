"""The wall clock, watched: a step of it is said.

The server reads the wall clock (``time.time``) only where a time must mean the same in
two processes or to a client: a token's ``exp`` and ``nbf`` (``entitlement_token.py``;
``app.py`` closes expired sessions), an MQTT session record's ``saved_at`` and a Standard
member's take-up generation (``mqtt_store.py``), a Raft preamble's timestamp
(``cluster/raft_front.py``), and the times it reports. Every timeout, retry and pace
reads the monotonic clock. A step of the wall clock -- an NTP correction, a VM resumed
after a pause, a clock set by hand -- changes what those mean at once, and nothing said
so. So once a second the server compares how far the wall clock moved with how far the
monotonic clock did: a difference over :data:`STEP_SECONDS` is a step, logged at
WARNING with its size and what it does, counted (``wall_clock_steps``,
``migratory_wall_clock_steps_total``). NTP's slewing (at most 0.5 ms a second) is none.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

log = logging.getLogger("migratory.clock")

STEP_SECONDS = 1.0
"""How far the wall clock may move apart from the monotonic clock between two looks
before it is a step (a look is every second: a slew moves it 0.5 ms)."""


class WallClockWatch:
    """Compares the wall clock's moves with the monotonic clock's (both injectable)."""

    def __init__(
        self,
        *,
        wall: Callable[[], float] = time.time,
        monotonic: Callable[[], float] = time.monotonic,
    ) -> None:
        self._wall, self._monotonic = wall, monotonic
        self._last = (wall(), monotonic())

    def check(self) -> float:
        """The step since the last look, in seconds (forward > 0, back < 0; 0.0: none);
        a step is logged."""
        wall, monotonic = self._wall(), self._monotonic()
        last_wall, last_monotonic = self._last
        self._last = (wall, monotonic)
        step = (wall - last_wall) - (monotonic - last_monotonic)
        if abs(step) <= STEP_SECONDS:
            return 0.0
        if step > 0:
            effect = ("tokens whose exp it passed are expired (their sessions closed "
                      "4503), MQTT sessions whose client is away may expire at the next "
                      "sweep")
        else:
            effect = ("tokens that expired within the step are accepted again until it "
                      "passes their exp, MQTT session records expire that much later")
        log.warning(
            "the wall clock stepped %s %.1f s against the monotonic clock (an NTP "
            "correction, a VM resumed after a pause, or the clock set by hand): %s. "
            "If this node's clock was right before, check its NTP (docs/cluster.md, "
            "Clocks)", "forward" if step > 0 else "back", abs(step), effect)
        return step
