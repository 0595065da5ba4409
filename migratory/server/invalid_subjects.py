"""Saying that a subject that is not valid came in numbered: a committed message of an
older member's Raft log, applied as committed (docs/cluster.md). The hub calls
``note`` (given by the layer that builds it: :func:`migratory.server.app.build_hub`), so
the hub -- imported by the cluster's sans-I/O link code -- logs nothing itself."""

from __future__ import annotations

import logging
import time

log = logging.getLogger("migratory.hub")

LOG_SECONDS = 60.0
"""At most one warning per this many seconds; the subjects in between are counted."""


class InvalidSubjectLog:
    """A warning for the first invalid subject, then at most one per :data:`LOG_SECONDS`
    saying how many came since."""

    def __init__(self) -> None:
        self._last = -LOG_SECONDS
        self._held_back = 0

    def note(self, subject: str) -> None:
        now = time.monotonic()
        if now - self._last < LOG_SECONDS:
            self._held_back += 1
            return
        log.warning("applied a committed message of the invalid subject %r (%d more since "
                    "the last warning): kept at its position, matched by no MQTT filter; no "
                    "client or peer publish of one is taken (docs/cluster.md)",
                    subject[:80], self._held_back)
        self._last, self._held_back = now, 0
