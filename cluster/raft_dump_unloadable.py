"""A dump this seed cannot load: it says why it is not ready, once.

pysyncobj loads a dump -- the seed's own ``raft.dump`` at start, or one its leader sends
-- under a bare ``except`` that logs ``failed to load full dump`` with a traceback and
goes on. A seed started on a dump another version wrote (a downgrade without
``migratory downgrade-dump``: 524f73f on this version's dump, or this version on a later
one's) then applies nothing for ever -- its journal starts after the dump -- while it
still takes and acknowledges its leader's entries: its readiness said only "member has
not caught up with Raft yet", and its leader, which sends no dump to a seed that holds
the log, said nothing (docs/cluster.md, "Downgrading to 524f73f"). A seed sent a
leader's dump it cannot load logged the traceback at each send, 10 to 25 a second.

:class:`UnloadableDump` watches each load (:meth:`UnloadableDump.loading`, on the Raft
thread): pysyncobj's line and ours about a dump not loaded are held back; the first
failure is one ERROR naming the dump, the error and what to do (with the traceback),
the same failure again only counted (an ERROR every :data:`REPEAT` seconds with the
count); :attr:`UnloadableDump.reason` is the seed's readiness reason (``/readyz``,
``GET /cluster`` ``raft_dump_unloadable``) until a dump loads.
"""

from __future__ import annotations

import contextlib
import gzip
import logging
import zlib
from collections.abc import Callable, Iterator
from types import TracebackType
from typing import TypeAlias

from cluster.dump_decoder import DumpDecodeError

log = logging.getLogger("migratory.raft")

__all__ = ["REPEAT", "UnloadableDump"]

REPEAT = 60.0
"""Seconds between two ERRORs while the same dump goes on not loading."""
_HELD_BACK = ("failed to load full dump",  # pysyncobj's words (ours too: raft_dump_chunks)
              "Raft: the leader's dump could not be loaded")  # (raft_follower.py)
_LOGGERS = ("pysyncobj.syncobj", "migratory.raft")
OWN = "its own dump"
LEADERS = "the leader's dump"
_ExcInfo: TypeAlias = tuple[type[BaseException], BaseException, TracebackType | None]
_DAMAGE = (DumpDecodeError, EOFError, gzip.BadGzipFile, zlib.error)
"""What a dump damaged on the way or on the disk raises (a CRC, a stream cut short): not
a dump of another version, which fails on what it holds (``KeyError: 'cached'``)."""


class _Held(logging.Filter):
    """Holds back the lines about a dump not loaded, keeping the first error's details."""

    def __init__(self) -> None:
        super().__init__()
        self.failed = False
        self.exc_info: _ExcInfo | None = None

    def filter(self, record: logging.LogRecord) -> bool:
        if not str(record.msg).startswith(_HELD_BACK):
            return True
        self.failed = True
        if self.exc_info is None and record.exc_info and record.exc_info[1] is not None:
            self.exc_info = record.exc_info
        return False


class UnloadableDump:
    """The loads of one seed's Raft node; ``clock``: seconds, for :data:`REPEAT`."""

    def __init__(self, clock: Callable[[], float], dump_file: str | None = None) -> None:
        self._clock = clock
        self._dump_file = dump_file
        self.reason: str | None = None  # why this seed applies nothing (None: it may)
        self.failures = 0  # loads failed in a row
        self._logged_at: float | None = None
        self._held: _Held | None = None  # the loads under way (one at a time: nested)
        self._attempted = False

    @contextlib.contextmanager
    def loading(self, source: str) -> Iterator[None]:
        """Around pysyncobj's load of a dump (or what may lead to one: a part of the
        leader's dump, the last one loads it); ``source``: :data:`OWN` or :data:`LEADERS`."""
        if self._held is not None:  # (within another: it decides)
            yield
            return
        held = self._held = _Held()
        self._attempted = False
        loggers = [logging.getLogger(name) for name in _LOGGERS]
        for logger in loggers:
            logger.addFilter(held)
        try:
            yield
        finally:
            for logger in loggers:
                logger.removeFilter(held)
            self._held = None
        if held.failed:
            self._failed(source, held.exc_info)
        elif self._attempted:
            self.loaded()

    def attempted(self) -> None:
        """A load itself began (within :meth:`loading`)."""
        self._attempted = True

    def loaded(self) -> None:
        if self.reason is not None:
            log.info("Raft: a dump loaded: this seed applies the log again")
        self.reason, self.failures, self._logged_at = None, 0, None

    def _failed(self, source: str, exc_info: _ExcInfo | None) -> None:
        self.failures += 1
        error = "unreadable" if exc_info is None else (
            f"{type(exc_info[1]).__name__}: {exc_info[1]}"[:300])
        if source == OWN:
            where = f" ({self._dump_file})" if self._dump_file else ""
            self.reason = (
                f"Raft: this seed cannot load {OWN}{where}: {error}. It applies nothing "
                "until it loads one: a dump another migratory version wrote? Start the "
                "version that wrote it, or stop this seed and rewrite the dump for this one "
                "(`migratory downgrade-dump <ClusterDataDir>` before starting 524f73f on it; "
                "docs/cluster.md, \"Downgrading to 524f73f\")")
        elif exc_info is not None and isinstance(exc_info[1], _DAMAGE):
            self.reason = (
                f"Raft: this seed cannot load {LEADERS} ({error}), sent {self.failures} "
                "times in a row: damaged on the way or on the leader's disk (the leader "
                "sends it again; a dump damaged each time: check the leader's disk)")
        else:
            self.reason = (
                f"Raft: this seed cannot load {LEADERS} ({error}), sent {self.failures} "
                "times in a row: a leader of another migratory version? Upgrade this seed "
                "(docs/cluster.md, \"Upgrading and downgrading\")")
        now = self._clock()
        if self._logged_at is not None and now - self._logged_at < REPEAT:
            return
        first = self._logged_at is None
        self._logged_at = now
        if first:
            log.error("%s", self.reason, exc_info=exc_info)
        else:
            log.error("%s (%d failed loads in a row)", self.reason, self.failures)
