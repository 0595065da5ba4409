"""A seed's Raft timers, derived from one key: ``ClusterElectionTimeout``.

pysyncobj takes five timers that must keep their proportions (its ``SyncObjConf``
asserts ``raftMinTimeout > 3 x appendEntriesPeriod`` and ``connectionTimeout >=
raftMaxTimeout``). The operator sets one, the election timeout T in milliseconds
(default 150), and :meth:`RaftTimings.for_election_timeout` derives the rest in the
default's proportions, so the default is exactly the timers the seeds always had:

- each election timeout a random one in [T, 2T] (150-300 ms), doubled by the
  back-off of a seed that keeps standing (cluster/raft_election_timer.py);
- the leader's heartbeat (AppendEntries) every 4T/15 (40 ms): 3.75 of them per
  shortest timeout;
- a link silent for 20T/3 (1 s) is dropped, and a dial unanswered that long ends.

Why raise T: a follower stands when no heartbeat reached it for its timeout, so a
round trip between seeds near T (seeds in different zones, a starved box) makes seeds
stand while the leader lives, and each such election deposes it (docs/cluster.md,
"The election timeout"). What it costs: a failover waits T..2T before anyone stands.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from migratory.config_cluster import DEFAULT_ELECTION_TIMEOUT_MS, DEFAULT_SEED_LINK_WAIT

__all__ = ["DEFAULT_ELECTION_TIMEOUT_MS", "RaftTimings"]

HEARTBEATS_PER_TIMEOUT = 15 / 4  # pysyncobj wants more than 3
SILENT_LINK_TIMEOUTS = 20 / 3  # of T: 1 s at the default; pysyncobj wants at least 2


@dataclass(frozen=True, slots=True)
class RaftTimings:
    """Fast timers: a new leader ~0.4 s after a leader dies (measured in DESIGN.md)."""

    election_min: float = DEFAULT_ELECTION_TIMEOUT_MS / 1000
    election_max: float = 2 * DEFAULT_ELECTION_TIMEOUT_MS / 1000
    heartbeat: float = DEFAULT_ELECTION_TIMEOUT_MS / 1000 / HEARTBEATS_PER_TIMEOUT
    connection_timeout: float = DEFAULT_ELECTION_TIMEOUT_MS / 1000 * SILENT_LINK_TIMEOUTS
    reconnect: float = 0.3
    use_batch: bool = False
    compaction_entries: int = 20_000  # ClusterLogCompactionEntries
    compaction_seconds: float = 120.0  # ClusterLogCompactionTime
    compaction_bytes: int = 64 << 20  # ClusterLogCompactionBytes
    link_wait: float = float(DEFAULT_SEED_LINK_WAIT)  # ClusterSeedLinkWait (seed_link_wait.py)

    @classmethod
    def for_election_timeout(cls, milliseconds: int, **others: Any) -> RaftTimings:
        """The timers for ``ClusterElectionTimeout`` = ``milliseconds`` (see the module
        docstring); ``others``: the timers it does not decide (compaction, ...)."""
        base = milliseconds / 1000
        return cls(election_min=base, election_max=2 * base,
                   heartbeat=base / HEARTBEATS_PER_TIMEOUT,
                   connection_timeout=base * SILENT_LINK_TIMEOUTS, **others)
