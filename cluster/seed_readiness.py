"""A seed's readiness, from its Raft thread's last status (:mod:`cluster.raft_status`).

A seed serves clients once its Raft node is up, has caught up, reports, has a leader
(or lost it for less than :data:`LEADERLESS_GRACE`), neither it nor its hub is
behind the leader: a seed whose clients would see the cluster stand still is not ready
(``tests/cluster/test_cluster_seed_readiness.py``). Once after it started, it also waits
for a Raft link with every other seed (:mod:`cluster.seed_link_wait`, at most
``ClusterSeedLinkWait``).
"""

from __future__ import annotations

import time
from collections import deque

from cluster.raft_slow_disk import DiskSyncs
from cluster.raft_status import RaftStatus
from cluster.readiness import BEHIND_SECONDS
from cluster.seed_link_wait import LINK_WAIT, LinkWait

__all__ = ["BEHIND_SECONDS", "LEADERLESS_GRACE", "RAFT_SILENCE", "SeedReadiness"]

LEADERLESS_GRACE = 1.5
"""Seconds a seed may see no Raft leader (an election) and stay ready."""
RAFT_SILENCE = 2.0
"""Seconds without a status from the Raft thread (it publishes one every 50 ms) before
a seed is not ready: a Raft thread that stopped or hangs leaves its last status --
"ready, with a leader" -- in place for ever."""


def _refused(status: RaftStatus) -> str:
    """What a seed cut off by other seeds' Raft ports adds to its reason."""
    if not status.refused_by:
        return ""
    return (f": seeds {', '.join(status.refused_by)} close its Raft connections unanswered "
            "(most likely their clocks and this one's are more than 120 s apart: the log)")


def _why_silent(disk: DiskSyncs | None) -> str:
    """Why the Raft thread published nothing: a sync of a Raft file under way
    (cluster/raft_slow_disk.py), or a thread that stopped or hangs."""
    if disk is not None and disk.waiting_on is not None:
        return f"it waits for the disk: a sync of {disk.waiting_on} for {disk.waiting:.1f} s"
    return "its thread stopped or hangs"


class SeedReadiness:
    def __init__(self, handed: deque[float], link_wait: float = LINK_WAIT) -> None:
        """``handed``: when each committed batch the Raft thread handed over and the
        seed's loop has not taken yet was handed (the seed's, shared); ``link_wait``:
        ``ClusterSeedLinkWait``."""
        self._handed = handed
        self._leaderless_since: float | None = None
        self._leader_commits: deque[tuple[float, int]] = deque()  # (status time, commit)
        self._links = LinkWait(link_wait)

    def reason(self, status: RaftStatus | None, disk: DiskSyncs | None = None) -> str | None:
        """Why the seed whose Raft thread last published ``status`` is not ready, or
        None; ``disk``: its syncs now (a Raft thread waiting in one publishes nothing).
        Last, a (re)started seed waits for a Raft link with every other seed
        (:mod:`cluster.seed_link_wait`; looked at on every status, so that a wait that
        ended while the seed was not ready for another reason stays over)."""
        waiting = None if status is None or not status.at else self._links.reason(status)
        why = self._reason(status, disk)
        if why is None and waiting is not None:
            assert status is not None
            return waiting + _refused(status)
        return why

    def _reason(self, status: RaftStatus | None, disk: DiskSyncs | None) -> str | None:
        if status is None:
            return "Raft is starting (loading its log)"
        if status.stopped is not None:
            return f"Raft stopped: {status.stopped}"
        if status.listen_error is not None:
            return f"Raft {status.listen_error} (retrying)"
        if status.dump_unloadable is not None:  # (it applies nothing: never ready)
            return status.dump_unloadable
        silent = time.monotonic() - status.at
        if status.at and silent > RAFT_SILENCE:  # (also before it caught up: a thread
            # that died early; at 0: the status made before the thread's first)
            return f"Raft has not reported for {silent:.1f} s ({_why_silent(disk)})"
        if not status.ready:
            return "member has not caught up with Raft yet" + _refused(status)
        behind = self._behind(status) or self._hub_behind(status)
        if behind is not None:
            return behind
        if status.has_leader:
            self._leaderless_since = None
            return None
        now = time.monotonic()
        if self._leaderless_since is None:
            self._leaderless_since = now
        if now - self._leaderless_since < LEADERLESS_GRACE:
            return None
        return f"member has seen no Raft leader for over {LEADERLESS_GRACE} s" + _refused(status)

    def _behind(self, status: RaftStatus) -> str | None:
        """Why this seed is behind the leader, if it has not applied what the leader had
        committed :data:`BEHIND_SECONDS` ago."""
        commits = self._leader_commits
        if not commits or commits[-1][0] != status.at:
            commits.append((status.at, status.leader_commit))
        then = None
        while commits and status.at - commits[0][0] >= BEHIND_SECONDS:
            then = commits.popleft()
        if then is not None:
            commits.appendleft(then)  # the newest sample at least BEHIND_SECONDS old
            if status.last_applied < then[1]:
                return (
                    f"member is behind the Raft leader: applied {status.last_applied}, "
                    f"the leader had committed {then[1]} {status.at - then[0]:.1f} s ago"
                )
        return None

    def _hub_behind(self, status: RaftStatus) -> str | None:
        """Why this seed's hub is behind its own Raft log, if a batch Raft counts
        applied has not reached the hub for :data:`BEHIND_SECONDS`: held while a dump's
        numbering decodes, or handed over to a loop that has not taken it. Raft's
        ``last_applied`` counts such batches, so :meth:`_behind` cannot see it, and the
        clients would receive nothing while the seed stayed ready."""
        now = time.monotonic()
        handed = self._handed
        waiting = [(status.held_since, status.held, "held while a Raft dump decodes")]
        if handed:
            waiting.append((handed[0], len(handed), "handed over, not taken by the hub"))
        for since, count, why in waiting:
            if since is not None and now - since >= BEHIND_SECONDS:
                return (
                    f"member's hub is behind its Raft log: {count} committed batches "
                    f"{why} for {now - since:.1f} s"
                )
        return None
