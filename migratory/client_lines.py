"""Log lines about one client, on paths a storm walks for every client at once.

10,000 clients drained, cut off as slow consumers, denied by the entitlement, timed
out by their keep-alive after a network blip, or taken over when they reconnect: a line
each at INFO or WARNING is 10,000 lines, which bury the one line that matters and, on
a pipe, are dropped past the log writer's queue (``migratory.logs``). So each kind of
such line is logged at its level at most once every :data:`LINE_EVERY` seconds, the
next one saying how many like it were not; the others go to DEBUG (``LogLevel =
debug`` shows each). The totals are counters in ``GET /metrics`` (docs/monitoring.md:
migratory_connections_closed_total, migratory_slow_consumers_total,
migratory_entitlement_denials_total, migratory_protocol_errors_total) and
:attr:`ClientLines.held` counts the lines sent to DEBUG
(migratory_log_lines_held_total)."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Any

from migratory.protocol import close_codes

LINE_EVERY = 10.0


class ClientLines:
    """One line per kind every ``every`` seconds at its level, the others at DEBUG."""

    __slots__ = ("_kinds", "clock", "every", "held")

    def __init__(self, every: float = LINE_EVERY,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.every = every
        self.clock = clock
        self.held = 0  # lines logged at DEBUG instead of their level
        self._kinds: dict[str, tuple[float, int]] = {}  # kind -> (its last line, held since)

    def log(self, logger: logging.Logger, level: int, kind: str, message: str,
            *args: object, extra: dict[str, Any] | None = None) -> bool:
        """Log ``message % args`` at ``level`` if no line of ``kind`` was within
        ``every`` seconds, else at DEBUG; whether it was at ``level``."""
        now = self.clock()
        last = self._kinds.get(kind)
        if last is not None and now - last[0] < self.every:
            self._kinds[kind] = (last[0], last[1] + 1)
            self.held += 1
            logger.debug(message, *args, extra=extra)
            return False
        self._kinds[kind] = (now, 0)
        if last is not None and last[1]:
            message += " (%d more like it since the last such line: at DEBUG)"
            args = (*args, last[1])
        logger.log(level, message, *args, extra=extra)
        return True


lines = ClientLines()
"""The process's (the entitlement's lines, which have no server to hold theirs)."""


def closing(logger: logging.Logger, client: str, code: int, reason: str,
            extra: dict[str, Any] | None = None) -> None:
    """The line of a client the server closes with ``code``: at DEBUG for 4502 DRAINED
    (the drain says how many in one line, ``migratory.server.drain``), else one line per
    code every :data:`LINE_EVERY` seconds at INFO."""
    if code == close_codes.DRAINED.code:
        logger.debug("%s: closing with %d %s", client, code, reason, extra=extra)
        return
    lines.log(logger, logging.INFO, f"close {code}", "%s: closing with %d %s", client, code,
              reason, extra=extra)
