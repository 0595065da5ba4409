"""pysyncobj's lines about a seed's name that does not resolve: once a minute per name.

pysyncobj 0.3.17 looks a peer's name up again at each dial once its failed lookup is
older than ``dnsFailCacheTime`` (1 s here, cluster/raft.py) and logs each failure twice
("failed to resolve host NAME", then "failed to resolve hostname: NAME"): two warnings a
second for every seed that is away -- a StatefulSet pod being recreated has no DNS
record until it is up, and with no descriptor left (EMFILE) no lookup works at all --
for as long as it lasts. :class:`NameLookupFailures`, a filter on pysyncobj's resolver
logger (:func:`install`, by :class:`cluster.raft_transport.SeedLinkTransport`), drops
the second of each pair and lets the first through once every :data:`EVERY` seconds
per name, counting those it held back.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

LOGGER = "pysyncobj.dns_resolver"
EVERY = 60.0
"""Seconds between two lines about one name that still does not resolve."""
_FAILED = "failed to resolve host "
_FAILED_AGAIN = "failed to resolve hostname: "  # (pysyncobj's second line for the same)


class NameLookupFailures(logging.Filter):
    """One line per name every ``every`` seconds, with the count of those not said."""

    def __init__(self, every: float = EVERY, clock: Callable[[], float] = time.monotonic
                 ) -> None:
        super().__init__()
        self.every = every
        self.clock = clock
        self._said: dict[str, float] = {}  # name -> when it was last said
        self._unsaid: dict[str, int] = {}  # name -> failures since

    def filter(self, record: logging.LogRecord) -> bool:
        message = record.getMessage()
        if message.startswith(_FAILED_AGAIN):
            return False
        if not message.startswith(_FAILED):
            return True
        name = message[len(_FAILED):]
        now = self.clock()
        said = self._said.get(name)
        if said is not None and now - said < self.every:
            self._unsaid[name] = self._unsaid.get(name, 0) + 1
            return False
        if len(self._said) >= 1024:
            self._said.clear()
        self._said[name] = now
        unsaid = self._unsaid.pop(name, 0)
        record.msg = "Raft: %s: the seed is not up yet, or DNS fails (%s)"
        record.args = (message, f"{unsaid} more failed lookups since the last such line"
                       if unsaid else f"said again at most every {self.every:g} s")
        return True


def install() -> None:
    """Put the filter on pysyncobj's resolver logger (once per process)."""
    logger = logging.getLogger(LOGGER)
    if not any(isinstance(f, NameLookupFailures) for f in logger.filters):
        logger.addFilter(NameLookupFailures())
