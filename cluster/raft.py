"""The edge to pysyncobj: seed members replicate publish batches through Raft.

Every seed runs a ``SyncObj`` whose one consumer holds the
:class:`~cluster.coordination.Coordinator`. A batch of publish requests is a
single replicated command; when Raft commits it, every seed applies it to the
coordinator in the same order, which numbers its messages identically
everywhere, and hands the :class:`~cluster.coordination.CommittedBatch` to
the trio side. pysyncobj runs its own thread: nothing here blocks trio, and
everything coming back crosses over with ``run_sync_soon``.

pysyncobj's wire format is pickle; it always runs with ``password`` set
(encrypted, authenticated links), and :class:`RaftCoordination` refuses to
start without one.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pysyncobj import FAIL_REASON, SyncObjConf, SyncObjConsumer, replicated

from cluster.coordination import CommittedBatch, Coordinator, PublishRequest
from cluster.raft_follower import FollowerSafeSyncObj
from migratory.model.message import Message, Qos

log = logging.getLogger("migratory.raft")

# (origin, ref, subject, content, fields, retained, guaranteed): plain tuples pickle fast
WireRequest = tuple[str, int, str, bytes, dict[str, str], bool, bool]

# Definite refusals: the command was never appended. Anything else is unknown.
DEFINITE_FAILURES = frozenset(
    {
        FAIL_REASON.QUEUE_FULL,
        FAIL_REASON.MISSING_LEADER,
        FAIL_REASON.REQUEST_DENIED,
        FAIL_REASON.DISCARDED,  # another entry took its log index: it will never commit
    }
)


def to_wire(requests: Sequence[PublishRequest]) -> list[WireRequest]:
    return [
        (
            r.origin,
            r.ref,
            r.message.subject,
            r.message.content,
            dict(r.message.fields),
            r.message.retained,
            r.message.qos is Qos.GUARANTEED,
        )
        for r in requests
    ]


def from_wire(wire: Sequence[WireRequest]) -> list[PublishRequest]:
    return [
        PublishRequest(
            origin,
            ref,
            Message(subject, content, fields, retained, Qos.GUARANTEED if g else Qos.STANDARD),
        )
        for origin, ref, subject, content, fields, retained, g in wire
    ]


class CoordinationConsumer(SyncObjConsumer):  # type: ignore[misc]
    """The replicated state machine; only ``coordinator`` is replicated."""

    def __init__(self, on_commit: Callable[[CommittedBatch], None]) -> None:
        # attributes set before SyncObjConsumer.__init__ are not serialized
        self._on_commit = on_commit
        super().__init__()
        self.coordinator = Coordinator()

    @replicated  # type: ignore[untyped-decorator]
    def commit_batch(self, epoch_candidate: int, wire: list[WireRequest]) -> int:
        batch = self.coordinator.apply_wire(epoch_candidate, wire)
        self._on_commit(batch)
        clsn: int = batch.clsn
        return clsn


@dataclass(frozen=True, slots=True)
class RaftTimings:
    """Fast timers: a new leader ~0.4 s after a leader dies (measured in DESIGN.md)."""

    election_min: float = 0.15
    election_max: float = 0.30
    heartbeat: float = 0.04  # pysyncobj wants election_min > 3 x heartbeat
    connection_timeout: float = 1.0
    reconnect: float = 0.3
    use_batch: bool = False
    compaction_entries: int = 20_000  # ClusterLogCompactionEntries
    compaction_seconds: float = 120.0  # ClusterLogCompactionTime


def _journal_files(data_dir: Path | None) -> dict[str, str]:
    """pysyncobj's journal (log, term, vote) and its compaction dump under ``data_dir``."""
    if data_dir is None:
        return {}
    try:
        data_dir.mkdir(parents=True, exist_ok=True)
        (data_dir / ".writable").touch()
    except OSError as exc:
        raise OSError(exc.errno, f"ClusterDataDir {data_dir}: {exc.strerror}") from exc
    return {
        "journalFile": str(data_dir / "raft.journal"),
        "fullDumpFile": str(data_dir / "raft.dump"),
    }


def raft_address(cluster_address: tuple[str, int]) -> str:
    """Seeds run Raft on their cluster port + 1."""
    host, port = cluster_address
    return f"{host}:{port + 1}"


class RaftCoordination:
    """One seed's Raft node. Callbacks arrive on the pysyncobj thread."""

    def __init__(
        self,
        *,
        self_address: tuple[str, int],
        bind_address: tuple[str, int] | None = None,
        seed_addresses: Sequence[tuple[str, int]],
        password: str,
        on_commit: Callable[[CommittedBatch], None],
        on_state_changed: Callable[[], None] | None = None,
        timings: RaftTimings = RaftTimings(),
        data_dir: Path | None = None,
    ) -> None:
        """``data_dir`` keeps the Raft log, term and vote across restarts (``None``: memory
        only, for tests of a single process lifetime)."""
        if not password:
            raise ValueError("Raft must never run without a password (pickle on the wire)")
        self.consumer = CoordinationConsumer(on_commit)
        me = raft_address(self_address)
        others = [raft_address(a) for a in seed_addresses if a != self_address]
        conf = SyncObjConf(
            password=password,
            raftMinTimeout=timings.election_min,
            raftMaxTimeout=timings.election_max,
            appendEntriesPeriod=timings.heartbeat,
            connectionTimeout=timings.connection_timeout,
            connectionRetryTime=timings.reconnect,
            appendEntriesUseBatch=timings.use_batch,
            leaderFallbackTimeout=max(1.0, 4 * timings.election_max),
            commandsWaitLeader=True,
            onStateChanged=(lambda _old, _new: on_state_changed()) if on_state_changed else None,
            logCompactionMinEntries=timings.compaction_entries,
            logCompactionMinTime=timings.compaction_seconds,
            bindAddress=raft_address(bind_address) if bind_address else None,
            **_journal_files(data_dir),
        )
        self.address = me
        self.syncobj = FollowerSafeSyncObj(me, others, conf=conf, consumers=[self.consumer])
        if data_dir is not None:
            log.info(
                "Raft state in %s: term %s, commit index %s",
                data_dir,
                self.syncobj.raftCurrentTerm,
                self.syncobj.raftCommitIndex,
            )

    def submit(
        self,
        epoch_candidate: int,
        requests: Sequence[PublishRequest],
        on_done: Callable[[int | None, str | None, bool], None],
    ) -> None:
        """Replicate one batch; ``on_done(clsn, error, unknown)`` on the pysyncobj thread."""

        def callback(result: Any, error: int) -> None:
            if error == FAIL_REASON.SUCCESS:
                on_done(int(result), None, False)
            else:
                on_done(None, _fail_name(error), error not in DEFINITE_FAILURES)

        self.consumer.commit_batch(epoch_candidate, to_wire(requests), callback=callback)

    @property
    def has_leader(self) -> bool:
        return self.syncobj._getLeader() is not None

    @property
    def is_leader(self) -> bool:
        leader = self.syncobj._getLeader()
        return leader is not None and str(leader) == self.address

    def status(self) -> dict[str, Any]:
        raw = self.syncobj.getStatus()
        leader = raw.get("leader")
        return {
            "raft_address": self.address,
            "raft_state": {0: "follower", 1: "candidate", 2: "leader"}.get(raw.get("state"), "?"),
            "raft_leader": None if leader is None else str(leader),
            "raft_term": raw.get("raft_term"),
            "raft_commit_index": raw.get("commit_idx"),
            "raft_last_applied": raw.get("last_applied"),
            "raft_ready": bool(self.syncobj.isReady()),
            "clsn": self.consumer.coordinator.clsn,
            "coordinator_digest": self.consumer.coordinator.digest(),
        }

    def close(self) -> None:
        self.syncobj.destroy_synchronous()


def _fail_name(code: int) -> str:
    for name in dir(FAIL_REASON):
        if not name.startswith("_") and getattr(FAIL_REASON, name) == code:
            return name
    return f"FAIL_{code}"
