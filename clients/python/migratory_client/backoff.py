"""Reconnect policy: exponential back-off with jitter, bounded, reset after a good session:
one that stayed up ``healthy_after`` seconds after ``connected``, whatever ended it. Same
rule as the JavaScript SDK (clients/js/src/backoff.js).

Pure: no I/O; the random source is injected.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

__all__ = ["Backoff", "ReconnectPolicy"]


@dataclass(frozen=True, slots=True)
class ReconnectPolicy:
    """How the client retries after losing (or failing to open) a session.

    The n-th consecutive retry waits ``min(max_delay, initial_delay * multiplier**n)``
    shortened by a random fraction up to ``jitter`` (0 = none, 1 = anywhere down to 0).
    ``max_attempts`` consecutive failed attempts (None = never) end the client with
    ``ServerUnavailableError``. An attempt fails unless its session stays up
    ``healthy_after`` seconds after ``connected``: a server that answers ``connected``
    and drops the session sooner (a crash loop, even one that answers pings) is backed
    off from like one that cannot be reached, so a client connects to it at most once
    per ``healthy_after`` seconds; a session that lasted longer resets the back-off
    however it ended (a drain, a member restarted in a rolling update), so healthy
    sessions never add up to ``max_attempts``. ``connect_timeout`` bounds the WebSocket
    handshake plus the ``connect``/``connected`` exchange.
    """

    initial_delay: float = 0.5
    max_delay: float = 30.0
    multiplier: float = 2.0
    jitter: float = 0.5
    max_attempts: int | None = None
    connect_timeout: float = 10.0
    healthy_after: float = 5.0

    def __post_init__(self) -> None:
        if not 0 < self.initial_delay <= self.max_delay:
            raise ValueError("ReconnectPolicy: need 0 < initial_delay <= max_delay")
        if not self.multiplier >= 1:  # (NaN too: every check here is one NaN fails)
            raise ValueError("ReconnectPolicy: multiplier must be >= 1")
        if not 0 <= self.jitter <= 1:
            raise ValueError("ReconnectPolicy: jitter must be within [0, 1]")
        if self.max_attempts is not None and self.max_attempts < 1:
            raise ValueError("ReconnectPolicy: max_attempts must be >= 1 or None")
        if not self.connect_timeout > 0:  # NaN: ValueError out of the client's task
            raise ValueError("ReconnectPolicy: connect_timeout must be > 0")
        if not self.healthy_after > 0:
            raise ValueError("ReconnectPolicy: healthy_after must be > 0")


class Backoff:
    """The delays before successive reconnect attempts."""

    __slots__ = ("_base", "_policy", "_rng", "failures")

    def __init__(self, policy: ReconnectPolicy, rng: random.Random) -> None:
        self._policy = policy
        self._rng = rng
        self._base = policy.initial_delay
        self.failures = 0
        """Consecutive failed attempts since the last successful session."""

    def next_delay(self) -> float:
        """Count one more failure and return how long to wait before the next attempt."""
        self.failures += 1
        base = self._base
        self._base = min(self._policy.max_delay, base * self._policy.multiplier)
        return base * (1.0 - self._policy.jitter * self._rng.random())

    def reset(self) -> None:
        """A session proved good (it stayed up ``healthy_after`` s): the next failure
        starts from ``initial_delay`` again."""
        self._base = self._policy.initial_delay
        self.failures = 0

    def exhausted(self) -> bool:
        """Whether ``max_attempts`` consecutive attempts have failed."""
        limit = self._policy.max_attempts
        return limit is not None and self.failures >= limit
