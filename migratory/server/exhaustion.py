"""Connections refused for want of a file descriptor: said once, then counted.

While a process has no descriptor left (``EMFILE``; ``ENFILE``: the whole system), every
``accept`` on a listener with a connection waiting fails at once and the listener stays
readable, so an accept loop retries every few milliseconds, and a dial fails the same
way. trio's ``serve_listeners`` logged an ERROR with a traceback for each retry (every
0.1 s per listener), pysyncobj a traceback per dial of a seed: hundreds of lines a
minute just when the operator reads the log to find out what is wrong.

An :class:`Exhaustion` belongs to one accept loop (or one dialler) and says, at
WARNING, without a traceback: the first failure, with what to do about it; then, while
it lasts, at most one line every :data:`LOG_EVERY` seconds with how many failed since
the last line; and once the loop succeeds again, how many failed in all. A loop that
alternates failures and successes is held to the same interval. No I/O but the log;
one thread per instance (the trio thread's loops and the Raft thread have their own).
"""

from __future__ import annotations

import errno
import logging
import os
import resource
import time
from collections.abc import Callable

CAPACITY_ERRNOS = frozenset({errno.EMFILE, errno.ENFILE, errno.ENOMEM, errno.ENOBUFS})
"""What ``accept`` or ``socket`` return when the process or the kernel is out of
descriptors or socket memory: worth trying again after a pause, not a broken socket."""
RETRY_SECONDS = 0.1
"""The pause before the next ``accept`` after one of those (trio's, kept)."""
LOG_EVERY = 30.0
"""Seconds between two lines about one loop's failures while they last."""


def _open_file_limit() -> str:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft == resource.RLIM_INFINITY:
        return "unlimited"
    return f"{soft}" if soft == hard else f"{soft} (hard limit {hard})"


def remedy(code: int | None) -> str:
    """What the operator does about an accept or dial that failed with ``code``."""
    if code == errno.EMFILE:
        return (f"this process has no file descriptor left (its open-file limit is "
                f"{_open_file_limit()}): raise it (LimitNOFILE= in its systemd unit, "
                "'ulimit -n' where it starts, the container's nofile ulimit), or find "
                "what holds its descriptors (ls /proc/<pid>/fd)")
    if code == errno.ENFILE:
        return ("the system's open-file table is full: raise fs.file-max (sysctl), or "
                "find the process that holds the descriptors")
    return "the kernel is short of memory for sockets: look at the host's memory"


def describe(exc: OSError) -> str:
    """``EMFILE (Too many open files)``."""
    code = exc.errno
    if code is None:
        return str(exc)
    return f"{errno.errorcode.get(code, str(code))} ({os.strerror(code)})"


class Exhaustion:
    """The failures of one accept loop (or dialler) for want of descriptors, logged."""

    def __init__(
        self,
        log: logging.Logger,
        what: str,
        *,
        retry: float = RETRY_SECONDS,
        every: float = LOG_EVERY,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        """``what``: the loop, as the log lines start (``cluster link port 0.0.0.0:9001:
        cannot accept...``); ``retry``: its pause after a failure, as they say."""
        self.log = log
        self.what = what
        self.retry = retry
        self.every = every
        self.clock = clock
        self.failures = 0
        """Every failure counted since the loop started."""
        self._since_line = 0  # failures since the last line
        self._episode = 0  # failures since the last success
        self._began = 0.0  # when the first of those came
        self._said = False  # whether this episode's failures were logged
        self._line_at: float | None = None  # when the last line was logged

    @property
    def exhausted(self) -> bool:
        """Whether the last attempt failed (no success since)."""
        return self._episode > 0

    def failed(self, exc: OSError, action: str = "accept a connection") -> None:
        """Count one failure of ``action``; log it if no line was logged for ``every``."""
        now = self.clock()
        self.failures += 1
        self._since_line += 1
        if self._episode == 0:
            self._began = now
        self._episode += 1
        if self._line_at is not None and now - self._line_at < self.every:
            return
        if self._since_line == 1:
            self.log.warning(
                "%s: cannot %s: %s; %s. Trying again every %g s (said again at most every "
                "%g s while it lasts)", self.what, action, describe(exc), remedy(exc.errno),
                self.retry, self.every,
            )
        else:
            self.log.warning(
                "%s: cannot %s: %s, %d times since the last such line; %s",
                self.what, action, describe(exc), self._since_line, remedy(exc.errno),
            )
        self._line_at = now
        self._since_line = 0
        self._said = True

    def succeeded(self) -> None:
        """The loop accepted (or dialled) again; says so if its failures were said."""
        if self._episode == 0:
            return
        if self._said:
            now = self.clock()
            self.log.warning(
                "%s: working again after %d failures over %.1f s",
                self.what, self._episode, now - self._began,
            )
            self._line_at = now
            self._since_line = 0
        self._episode = 0
        self._said = False
