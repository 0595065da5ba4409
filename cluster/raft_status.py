"""What a seed's Raft thread last saw, published for the trio side (:mod:`cluster.raft`).

The trio side never reads pysyncobj's internals: the Raft thread publishes an immutable
:class:`RaftStatus` every ``STATUS_PERIOD`` (and on every state change), which the trio
side reads as one reference (readiness, ``GET /cluster``).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from cluster.raft_front_server import FrontStatistics

__all__ = ["RaftStatus"]

_NO_FRONT = FrontStatistics()


@dataclass(frozen=True, slots=True)
class RaftStatus:
    """What the Raft thread last saw; read by the trio side as one reference."""

    state: str = "starting"  # follower | candidate | leader | starting
    leader: str | None = None
    term: int = 0
    commit_index: int = 0
    last_applied: int = 0
    leader_commit: int = 0
    """The leader's commit index as this seed last heard it (its own when it leads)."""
    ready: bool = False
    clsn: int = 0
    digest: str = ""
    at: float = 0.0
    linked: tuple[str, ...] = ()  # the other seeds' Raft addresses this seed has a link to
    seeds: tuple[str, ...] = ()  # the other seeds' Raft addresses, linked or not
    unresolved: tuple[str, ...] = ()
    """Seeds not linked whose names do not resolve, looked up for the first
    ``ClusterSeedLinkWait`` after ``started`` only (cluster/seed_link_wait.py)."""
    started: float = 0.0  # when this seed's Raft node was made (time.monotonic)
    front: FrontStatistics = _NO_FRONT  # the Raft port's front: admitted, refused
    refused_by: tuple[str, ...] = ()
    """Seeds whose Raft port closed this seed's last dial unanswered (raft_transport.py)."""
    listen_error: str | None = None
    """Why the Raft port cannot be bound (pysyncobj retries it; no election meanwhile)."""
    stopped: str | None = None
    """Why this seed stopped taking part in Raft: a file it could not write (raft_disk.py)."""
    dump_failures: int = 0
    """Dumps (log compactions) that failed not for the disk: a bug (raft_dump_files.py)."""
    subjects: int = 0
    """Subjects the replicated numbering holds: every one ever published (subject_count.py)."""
    snapshots: int = 0
    """Retained snapshots the replicated caches hold (kept for ever too)."""
    forward_hold: dict[str, int] = field(default_factory=dict)
    """Commands held while the link to the leader was down (cluster/raft_forward.py)."""
    held: int = 0
    held_since: float | None = None
    """Committed batches held from the hub while a dump's numbering decodes, and since
    when (cluster/raft_consumer.py): Raft counts them applied (``last_applied``)."""
    dumps_untaken: dict[str, int] = field(default_factory=dict)
    """A leader's: seeds sent its dump again and again, not taking it
    (cluster/raft_dump_untaken.py)."""
    dump_unloadable: str | None = None
    """Why this seed applies nothing: a dump it cannot load (cluster/raft_dump_unloadable.py)."""
    entries_taken: int = 0
    """Entries this seed's Raft node took in since it started: the commands it appended
    as leader, the entries its leader sent it as follower (``SeedCoordination.activity``)."""

    @property
    def has_leader(self) -> bool:
        return self.leader is not None
