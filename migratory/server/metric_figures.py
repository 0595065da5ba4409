"""The figures a server and a cluster member keep for ``GET /metrics`` (:mod:`.metrics`
turns them into metric families when Prometheus scrapes): plain dataclasses, so that a
process imports ``prometheus_client`` only when it is first scraped, never to start
(about 130 modules with what it imports: http.server, email, wsgiref, ...).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from migratory.server.metric_buckets import LATENCY_BOUNDS, Buckets


@dataclass(slots=True)
class PublishTimings:
    """Latencies of this member's own publishes, from the moment a client's publish was
    read: until the hub handed the message to the subscribers' outboxes (``fanout``)
    and until its ``PUBLISH_OK`` was queued (``ack``)."""

    fanout: Buckets = field(default_factory=lambda: Buckets(LATENCY_BOUNDS))
    ack: Buckets = field(default_factory=lambda: Buckets(LATENCY_BOUNDS))


@dataclass(frozen=True, slots=True)
class PeerLink:
    """One link of a cluster member to another, as the cluster package sees it."""

    peer: str
    kind: str  # raft (seed to seed) | upstream (non-seed to its seed) | follower | forward
    up: bool
    lag: int | None = None  # committed batches (clsn) the far side of the link is behind


@dataclass(frozen=True, slots=True)
class ClusterMetrics:
    """What a cluster member reports about its place in the cluster (filled by the
    cluster package, which this package never imports)."""

    member: str
    role: str  # seed | non-seed | member (Standard mode)
    raft_state: str | None = None  # leader | follower | candidate | starting
    raft_term: int | None = None
    raft_commit_index: int | None = None
    raft_last_applied: int | None = None
    raft_dump_failures: int | None = None
    raft_slow_syncs: int | None = None
    """Syncs of the seed's Raft files that took 0.1 s or more (cluster/raft_slow_disk.py)."""
    raft_sync_waiting: float | None = None
    """Seconds the sync under way has waited (0.0: none is): its Raft thread waits too."""
    link_refusals: tuple[tuple[str, int], ...] = ()
    """(limit, count): connections to the cluster link port refused before their
    handshake was done (cluster/link_accept.py)."""
    link_violations: tuple[tuple[str, int], ...] = ()
    """(rule, count): authenticated links this member closed because the peer broke a
    rule of the link (cluster/link_limits.py)."""
    link_publishes_refused: tuple[tuple[str, int], ...] = ()
    """(status, count): peers' publishes refused by the check a client's publish passes
    (cluster/link_publishes.py); the link stays up."""
    raft_front_refused: tuple[tuple[str, int], ...] = ()
    """(reason, count): connections the seed's Raft port refused (cluster/raft_front_server.py)."""
    raft_front_skew: float | None = None
    """Seconds the clock of the last seed that proved the password is ahead of this one's."""
    raft_subjects: int | None = None  # subjects the seeds' numbering holds (for ever)
    raft_snapshots: int | None = None  # retained snapshots the seeds' caches hold
    applied_clsn: int | None = None
    links: tuple[PeerLink, ...] = ()
    commit_latency: Buckets | None = None
