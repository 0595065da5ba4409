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
"""

from __future__ import annotations

__all__ = ["PAST_DEADLINE", "poll_timeout"]

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
