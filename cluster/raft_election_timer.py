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
"""

from __future__ import annotations

__all__ = ["PAST_DEADLINE", "deadline_after_joining", "poll_timeout"]

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
