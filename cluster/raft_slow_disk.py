"""A seed whose disk is slow (not full, not lost: slow) says so, once per episode.

Network-attached volumes stall: an ``fdatasync`` that takes 0.1-0.4 ms takes 1-5 s for
a while (a noisy neighbour, a volume being migrated). Every sync of a seed's Raft files
(:mod:`cluster.raft_durability`: the journal before a tick counts or answers what it
wrote, the term and vote before a vote, a dump) runs on pysyncobj's Raft thread, which
does nothing else meanwhile: no message handled, no heartbeat sent. The cluster copes
(docs/cluster.md, "A slow disk"): a leader stuck past the election timeout loses its
lead to a follower that can commit, and steps down itself once it wakes
(``leaderFallbackTimeout``); a stuck follower cannot depose the leader (pre-vote,
:mod:`cluster.raft_prevote`) and the other two commit without it. But nothing said why:
leader changes, publishes slow or failed at their timeout, no line naming the disk
(``tests/cluster/test_raft_slow_disk.py`` measured 1-3 s stalls and found no log line).

:class:`SyncTimes` times every sync (:func:`cluster.raft_durability.synced`). One that
takes :data:`SLOW_SYNC_SECONDS` or more begins an *episode*, said in one WARNING naming
the file and how long its sync took; later slow syncs of the episode are only counted.
The episode ends once no sync was slow for :data:`QUIET_SECONDS`, said in one INFO
line with the count and the longest. ``GET /cluster`` (``raft_disk``) and ``/metrics``
(``migratory_raft_slow_syncs_total``, ``migratory_raft_sync_waiting_seconds``) show it
-- the sync under way too, read from the trio thread while the Raft thread waits in it.

One per process (a seed runs one Raft node): :data:`SYNCS`.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, replace

log = logging.getLogger("migratory.raft")

__all__ = ["QUIET_SECONDS", "SLOW_SYNC_SECONDS", "SYNCS", "DiskSyncs", "SyncTimes"]

SLOW_SYNC_SECONDS = 0.1
"""A sync this long or longer is slow: some 300 times the usual, and most of the default
election timeout (150 ms), past which the followers of a leader stuck in it stand."""
QUIET_SECONDS = 10.0
"""An episode ends once no sync was slow for this long."""


@dataclass(frozen=True, slots=True)
class DiskSyncs:
    """What :class:`SyncTimes` saw, for ``GET /cluster`` and ``/metrics``."""

    slow_syncs: int = 0
    """Syncs that took :data:`SLOW_SYNC_SECONDS` or more since the process started."""
    episodes: int = 0
    slow: bool = False
    """In an episode now: a sync was slow within the last :data:`QUIET_SECONDS`."""
    longest: float = 0.0
    """The longest sync of the episode under way, or of the last one (seconds)."""
    waiting: float = 0.0
    """How long the sync under way now has waited (0.0: none is)."""
    waiting_on: str | None = None
    """The file or directory of the sync under way."""


@dataclass(frozen=True, slots=True)
class _Episode:
    began: float
    last_slow: float
    syncs: int
    longest: float
    longest_on: str


class SyncTimes:
    """Times the syncs of one process's Raft files; :meth:`statistics` from any thread."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self.clock = clock
        self.slow_syncs = 0
        self.episodes = 0
        self._episode: _Episode | None = None  # replaced whole, never changed in place
        self._last_longest = 0.0
        self._under_way: tuple[str, float] | None = None
        self._lock = threading.Lock()  # (syncs from the Raft thread and a dump's loader)

    def timed(self, on: str, sync: Callable[[], None]) -> None:
        """``sync()`` (of the file or directory ``on``), timed."""
        started = self.clock()
        self._under_way = (on, started)
        try:
            sync()
        finally:
            self._under_way = None
            self.took(on, self.clock() - started)

    def took(self, on: str, seconds: float) -> None:
        """A sync of ``on`` took ``seconds``."""
        with self._lock:
            now = self.clock()
            self._end_if_quiet(now - seconds)  # (quiet until this sync began)
            if seconds < SLOW_SYNC_SECONDS:
                return
            self.slow_syncs += 1
            episode = self._episode
            if episode is None:
                self.episodes += 1
                self._episode = _Episode(now, now, 1, seconds, on)
                log.warning(
                    "Raft: the disk is slow: a sync of %s took %.2f s (a local disk takes "
                    "under a millisecond). While a sync waits this seed's Raft neither "
                    "answers nor sends: as leader it loses the lead past the election "
                    "timeout, as follower the others commit without it. Said once, until "
                    "no sync was slow for %g s", on, seconds, QUIET_SECONDS,
                )
                return
            longest = seconds > episode.longest
            self._episode = replace(
                episode, last_slow=now, syncs=episode.syncs + 1,
                longest=seconds if longest else episode.longest,
                longest_on=on if longest else episode.longest_on,
            )

    def check(self, now: float) -> None:
        """Ends an episode with no slow sync for :data:`QUIET_SECONDS` (the Raft thread
        calls this with its status, so an episode's end is said without a sync)."""
        with self._lock:
            self._end_if_quiet(now)

    def _end_if_quiet(self, now: float) -> None:
        episode = self._episode
        if episode is None or now - episode.last_slow < QUIET_SECONDS:
            return
        self._episode = None
        self._last_longest = episode.longest
        log.info(
            "Raft: the disk is fast again: %d sync(s) in %.1f s took %g s or more, the "
            "longest %.2f s (%s)", episode.syncs, episode.last_slow - episode.began,
            SLOW_SYNC_SECONDS, episode.longest, episode.longest_on,
        )

    def statistics(self) -> DiskSyncs:
        episode, under_way = self._episode, self._under_way
        return DiskSyncs(
            slow_syncs=self.slow_syncs,
            episodes=self.episodes,
            slow=episode is not None,
            longest=self._last_longest if episode is None else episode.longest,
            waiting=0.0 if under_way is None else max(0.0, self.clock() - under_way[1]),
            waiting_on=None if under_way is None else under_way[0],
        )


SYNCS = SyncTimes()
"""This process's (tests give each world one of its own)."""
