"""A follower stands for election at its own deadline, not at the next 50 ms tick.

pysyncobj's Raft thread checks the election deadline once per tick and otherwise waits
in ``poll`` for up to ``autoTickPeriod`` (50 ms). While a leader lives, its
AppendEntries wake every follower at the same moment; once it dies nothing wakes them,
so both followers tick in step, 50 ms apart, from that last message on. Their random
deadlines (``raftMinTimeout``..``raftMaxTimeout``, 150-300 ms) were thereby rounded to
the same few instants: in about one failover in three both stood within the same
millisecond, split the vote and needed another election (traced with
benchmarks/cluster_failover.py: first candidacies 202 or 252 ms after the leader's
link dropped, never in between). :func:`poll_timeout` shortens the wait so the tick
after it comes just past the deadline: the randomness Raft relies on is kept.

A seed just started does not stand the moment its first link comes up.
pysyncobj holds no election while connected to no one, so a restarted seed's deadline
had long passed when its first link came up, and it stood in that very millisecond,
before the live leader's first AppendEntries could reach it (traced: "node connected"
and "candidate" in the same ms). With a stale log it cannot win, but its higher term
made the others drop the leader: an election, and publishes failed with
LEADER_CHANGED, at such a seed restart. :func:`deadline_after_joining` gives it one
election timeout of listening first; a whole cluster starting together elects one
timeout later, a failover (the survivors are linked already) not at all.

A follower reads what came while its Raft thread was busy before it stands. pysyncobj
checks the election deadline first in a tick, then polls: after a tick longer than the
election timeout -- a large dump loaded, a long collection, a box far busier than its
cores -- it stood before it read the AppendEntries its leader had sent meanwhile, and
its higher term deposed that leader. :class:`ElectionBackoff` polls (without waiting)
first when the deadline has passed (``test_raft_election_timer.py``).

A seed that keeps standing waits longer each time (:class:`ElectionBackoff`). With
150-300 ms timeouts, a seed whose process runs only every few hundred milliseconds (a
box far busier than its cores, a container throttled by its CPU limit) times out
before the leader's AppendEntries or a candidate's votes reach it; every seed then stands
again and again. A chaos run of five seeds at a load average of 20 went 180 s without a
leader, the term climbing by ~100 a minute (seed 2811); ``raft_sim`` with every seed
ticking every 350 ms never elects one. So each candidacy doubles this seed's timeouts
(up to ``2 ** MAX_DOUBLINGS``) and each :data:`DECAY_SECONDS` without one halves them
again: a failover in a quiet cluster is unchanged (one candidacy, then the usual timeouts
some seconds later), a storm settles (``test_raft_election_timer.py``). The doublings
multiply the timeouts ``ClusterElectionTimeout`` sets (cluster/raft_timings.py), and a
halving waits at least as long as the longest of them, ``2 ** MAX_DOUBLINGS`` x
``raftMaxTimeout`` (:meth:`ElectionBackoff.decay_seconds`; 2.4 s at the default, so
:data:`DECAY_SECONDS`): with a fixed 5 s, timeouts of 1 s and more (4-8 s once doubled)
decayed before a seed could stand again, and the back-off never built up.
"""

from __future__ import annotations

import logging
from typing import Any

from pysyncobj import SyncObj
from pysyncobj import syncobj as syncobj_module
from pysyncobj.syncobj import _RAFT_STATE

__all__ = [
    "DECAY_SECONDS", "MAX_DOUBLINGS", "PAST_DEADLINE", "ElectionBackoff",
    "deadline_after_joining", "poll_timeout",
]

MAX_DOUBLINGS = 3
"""At most this many doublings of the election timeout (150-300 ms: 1.2-2.4 s)."""
DECAY_SECONDS = 5.0
"""Each this long without standing for election halves the timeouts again (at least:
:meth:`ElectionBackoff.decay_seconds`)."""

log = logging.getLogger("migratory.raft")

PAST_DEADLINE = 0.0005
"""How far past its deadline the tick that checks it comes (seconds)."""


def poll_timeout(time_to_wait: float, election_deadline: float, now: float, *,
                 leader: bool) -> float:
    """How long the Raft thread may wait for events before its next tick.

    ``time_to_wait`` is pysyncobj's (``autoTickPeriod``); a leader has no election
    deadline; a deadline already past was checked by this tick (and failed for want of
    a connection): the usual wait then, never a spin."""
    if leader or time_to_wait <= 0:
        return time_to_wait
    until = election_deadline - now
    if until <= 0:
        return time_to_wait
    return min(time_to_wait, until + PAST_DEADLINE)


def deadline_after_joining(deadline: float, now: float, timeout: float, *,
                           links: int, follower: bool, first: bool) -> float:
    """The election deadline once a link to another seed came up (``links`` counts it):
    a follower whose first link since it started this is listens for a whole
    ``timeout`` first."""
    if follower and first and links == 1:
        return max(deadline, now + timeout)
    return deadline


class ElectionBackoff(SyncObj):  # type: ignore[misc]
    """``SyncObj`` whose election timeouts double with each candidacy and halve again
    after each :data:`DECAY_SECONDS` without one, and which reads what came before it
    stands (see the module docstring)."""

    _doublings = 0
    _stood_at = 0.0

    def decay_seconds(self) -> float:
        """How long without standing halves the timeouts: :data:`DECAY_SECONDS`, or the
        longest timeout the doublings give, if longer (a large ``ClusterElectionTimeout``)."""
        return float(max(DECAY_SECONDS, 2 ** MAX_DOUBLINGS * self.conf.raftMaxTimeout))

    def election_doublings(self) -> int:
        """How many doublings this seed's timeouts carry now."""
        elapsed = syncobj_module.monotonicTime() - self._stood_at
        decayed = int(elapsed // self.decay_seconds())
        return max(0, self._doublings - decayed)

    def _SyncObj__setState(self, state: int) -> None:
        if state == _RAFT_STATE.CANDIDATE:
            doublings = self.election_doublings()
            self._doublings = min(MAX_DOUBLINGS, doublings + 1)
            self._stood_at = syncobj_module.monotonicTime()
            if doublings < MAX_DOUBLINGS == self._doublings:
                log.warning(
                    "Raft: this seed stood for election %d times, each within %.0f s of "
                    "the last; its election timeouts are %dx longer until it stands for "
                    "none for that long (a process short of CPU times out before the "
                    "others' messages reach it)", MAX_DOUBLINGS + 1, self.decay_seconds(),
                    2 ** MAX_DOUBLINGS,
                )
        super()._SyncObj__setState(state)

    def _onTick(self, timeToWait: float = 0.0) -> None:
        if (self._SyncObj__raftState != _RAFT_STATE.LEADER
                and self._SyncObj__raftElectionDeadline < syncobj_module.monotonicTime()):
            self._poller.poll(0)  # what came meanwhile first: the leader's, if it lives
        super()._onTick(timeToWait)

    def _SyncObj__generateRaftTimeout(self) -> Any:
        return super()._SyncObj__generateRaftTimeout() * 2 ** self.election_doublings()
