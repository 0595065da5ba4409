"""The edge to pysyncobj: seed members replicate publish batches through Raft.

Every seed runs a ``SyncObj`` whose one consumer holds the
:class:`~cluster.coordination.Coordinator`. A batch of publish requests is a
single replicated command; when Raft commits it, every seed applies it to the
coordinator in the same order, which numbers its messages identically
everywhere, and hands the :class:`~cluster.coordination.CommittedBatch` to
the trio side. pysyncobj runs its own thread: nothing here blocks trio, and
everything coming back crosses over with ``run_sync_soon``.

The replicated state also holds the message caches
(:mod:`cluster.replicated_cache`), so a seed restarted from a compacted log -- or
a follower sent the leader's dump -- gets them back with the numbering
(``on_restore``) instead of needing a peer's.

The trio side never reads pysyncobj's internals: the Raft thread publishes an
immutable :class:`RaftStatus` every :data:`STATUS_PERIOD` (and on every state
change), which the trio side reads as one reference.

pysyncobj's wire format is pickle; it always runs with ``password`` set
(encrypted, authenticated links), and :class:`RaftCoordination` refuses to
start without one.
"""

from __future__ import annotations

import errno
import logging
import os
import shutil
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict
from pathlib import Path
from typing import Any

from pysyncobj import FAIL_REASON, SyncObjConf
from pysyncobj.dns_resolver import globalDnsResolver

from cluster import dump_fork, raft_disk, raft_slow_disk, raft_unpickler
from cluster.cache_sync import CacheSync
from cluster.coordination import CommittedBatch, PublishRequest
from cluster.dump_decoder import DumpDecodeError, stop_reason
from cluster.raft_cipher import RaftCipher
from cluster.raft_compaction import bound_log_bytes, compaction_stagger
from cluster.raft_consumer import (
    HELD_SLICE,
    CoordinationConsumer,
    RaftClosing,
    WireRequest,
    from_wire,
    to_wire,
)
from cluster.raft_data_dir import ACCESS_ERRORS, ACCESS_REMEDY
from cluster.raft_dump_old_format import OldFormatDump
from cluster.raft_dump_unloadable import LEADERS, OWN, UnloadableDump
from cluster.raft_dump_untaken import UntakenDumps
from cluster.raft_follower import FollowerSafeSyncObj
from cluster.raft_forward import NOT_SENT, NOT_SENT_NAME, HoldsForwards, SendBy
from cluster.raft_outcomes import CLOSED_NAME
from cluster.raft_status import RaftStatus
from cluster.raft_timings import RaftTimings
from cluster.raft_transport import SeedLinkTransport
from cluster.seed_link_wait import LINK_WAIT, unresolved_seeds
from cluster.subject_count import SubjectCountWarning

__all__ = [  # (the consumer and its wire format live in cluster/raft_consumer.py)
    "DEFINITE_FAILURES", "CoordinationConsumer", "RaftCoordination", "RaftStatus",
    "RaftTimings", "WireRequest", "from_wire", "to_wire",
]

log = logging.getLogger("migratory.raft")
raft_unpickler.install()  # pysyncobj unpickles only our types and its own (raft_unpickler.py)
raft_disk.install()  # a full disk stops the seed with a message, not SIGBUS (raft_disk.py)

# Definite refusals: the command was never appended. Anything else is unknown.
DEFINITE_FAILURES = frozenset(
    {
        FAIL_REASON.QUEUE_FULL,
        FAIL_REASON.MISSING_LEADER,
        FAIL_REASON.REQUEST_DENIED,
        FAIL_REASON.DISCARDED,  # another entry took its log index: it will never commit
        NOT_SENT,  # held, never sent to any leader (cluster/raft_forward.py)
    }
)


DNS_CACHE_SECONDS = 1.0
"""How long pysyncobj may reuse a peer's resolved address (or a failed lookup)."""
STATUS_PERIOD = 0.05
"""Seconds between two :class:`RaftStatus` snapshots published by the Raft thread."""
DIGEST_PERIOD = 1.0
"""Least seconds between two computations of the coordinator digest (O(subjects))."""
DIGEST_SHARE = 0.01
"""Largest share of the Raft thread's time the digest may take: it sorts every subject
the seeds number (0.4 s of CPU at 1,000,000 subjects), so a large state spaces it out."""


def next_digest_at(now: float, took: float) -> float:
    """When to compute the digest again after one that took ``took`` seconds: after
    :data:`DIGEST_PERIOD`, or later so that it takes at most :data:`DIGEST_SHARE`."""
    return now + max(DIGEST_PERIOD, took / DIGEST_SHARE)


class _SeedSyncObj(HoldsForwards, FollowerSafeSyncObj):
    """Publishes a :class:`RaftStatus` from the Raft thread after its ticks; holds a
    command it cannot forward to the leader (cluster/raft_forward.py)."""

    def __init__(self, *args: Any, consumer: CoordinationConsumer, link_wait: float = LINK_WAIT,
                 **kwargs: Any) -> None:
        self._status_consumer = consumer
        self._link_wait = link_wait
        self._next_status = 0.0
        self._next_digest = 0.0
        self._digest = ""
        self.status_snapshot = RaftStatus()
        self.stopped: str | None = None
        self._func_names: dict[Any, str] = {}  # set before __init__: kept out of dumps
        self._subject_warning = SubjectCountWarning()
        self._entries_taken = 0  # (before __init__, as all of these: never dumped)
        self._started = time.monotonic()  # (the link wait's start: seed_link_wait.py)
        # before __init__: its tick thread starts connecting inside it
        self._cipher = RaftCipher(kwargs["conf"].password)
        dump_file = kwargs["conf"].fullDumpFile
        self._untaken_dumps = UntakenDumps(
            self, time.monotonic, None if dump_file is None else OldFormatDump(dump_file))
        self._unloadable = UnloadableDump(time.monotonic, dump_file)  # (start: loads it)
        super().__init__(*args, consumers=[consumer], **kwargs)
        self._untaken_dumps.watch(self._SyncObj__serializer)
        self._func_names.update(self._SyncObj__currentVersionFuncNames)

    def _SyncObj__loadDumpFile(self, clearJournal: bool) -> None:
        with self._unloadable.loading(LEADERS if clearJournal else OWN):
            self._unloadable.attempted()
            super()._SyncObj__loadDumpFile(clearJournal)

    def _install_dump(self, node: Any, message: dict[str, Any]) -> None:
        with self._unloadable.loading(LEADERS):  # (the last part loads it, or finds it unreadable)
            super()._install_dump(node, message)

    @property
    def encryptor(self) -> RaftCipher:
        """The seal of every Raft message (AES-GCM, :mod:`cluster.raft_cipher`), in
        place of pysyncobj's Fernet."""
        return self._cipher

    def _getEncryptor(self) -> RaftCipher:
        return self._cipher

    def _getFuncName(self, funcName: Any) -> str:
        """The versioned name of a replicated method, safe from any thread.

        The trio thread submits (calls ``commit_batch``), which looks this up, while the
        Raft thread may be loading a dump: pysyncobj then empties the table and refills
        it, and a submit in between died with ``KeyError: (id, 'commit_batch')`` (the
        chaos suite hit it). The names never change here (code version 0 only), so the
        table taken at start-up answers while pysyncobj's is being rebuilt.
        """
        name = self._SyncObj__currentVersionFuncNames.get(funcName)
        if name is None:
            name = self._func_names[funcName]
        return str(name)

    def _merge(self, held: list[Any], entries: list[Any]) -> None:
        """A follower's entries from its leader: counted, as what it is busy with while
        their commit comes late (an overloaded leader), though it applies nothing."""
        super()._merge(held, entries)
        self._entries_taken += len(entries)

    def _checkCommandsToApply(self) -> None:
        """A leader's commands (its own, and those other seeds forwarded): counted."""
        before = self._SyncObj__getCurrentLogIndex()
        super()._checkCommandsToApply()
        self._entries_taken += max(0, self._SyncObj__getCurrentLogIndex() - before)

    def _onTick(self, timeToWait: float = 0.0) -> None:
        if self.stopped is not None:  # handles no message, sends none
            time.sleep(timeToWait)
        else:
            try:  # batches held while a dump's numbering decoded, a slice at a time
                consumer = self._status_consumer
                if consumer.catch_up(time.monotonic() + HELD_SLICE):
                    timeToWait = 0.0  # (more of them at the next tick, at once)
                super()._onTick(timeToWait)
                consumer.cache.settle()  # a dump's decoded caches, once ready
            except RaftClosing:  # (the next turn of pysyncobj's loop destroys it)
                pass
            except DumpDecodeError as exc:  # not the other seeds' caches: it stops
                self._stop(stop_reason(exc, self._SyncObj__conf.fullDumpFile))
            except raft_disk.RaftDiskFailure as exc:
                self._stop(str(exc))
                log.critical(
                    "Raft: %s: this seed stops taking part in Raft (it must not acknowledge "
                    "or vote on what it cannot keep); its files are whole, the write that "
                    "failed was not made. To do: %s, then start it again",
                    exc, raft_disk.remedy(exc),
                )
        now = time.monotonic()
        if now >= self._next_status:
            self._next_status = now + STATUS_PERIOD
            self.publish_status(now)
            raft_slow_disk.SYNCS.check(now)  # an episode of slow syncs over: said

    def _stop(self, reason: str) -> None:
        """Stop taking part in Raft, and say so to the other seeds at once: their links
        to this node are closed (as a killed seed's are), its port too. Left open, a
        stopped leader looked alive to its followers until their election (and its
        links until ``connectionTimeout``): every command they forwarded meanwhile was
        lost in it, then failed "the Raft leader changed" -- 363 and 1,174 of a
        non-seed's publishes at 2,000/s (docs/cluster.md). A link found down before a
        command is written holds it for the next leader (cluster/raft_forward.py)."""
        self.stopped = reason
        self._SyncObj__transport.destroy()  # (no callback: its own are unset first)

    def _unresolved_seeds(self, now: float) -> tuple[str, ...]:
        """The seeds not linked whose names do not resolve, while a link wait may last
        (no lookups after it: a seed down for good would be looked up every second)."""
        if now - self._started > self._link_wait + 1.0:
            return ()
        return unresolved_seeds(self.otherNodes, self.isNodeConnected,
                                globalDnsResolver().resolve)

    def publish_status(self, now: float) -> None:
        coordinator = self._status_consumer.coordinator
        settled = not (coordinator.decoding or self._status_consumer.held)
        if now >= self._next_digest and settled:
            started = time.thread_time()
            self._digest = coordinator.digest()
            self._next_digest = next_digest_at(now, time.thread_time() - started)
        subjects = coordinator.subject_count
        snapshots = self._status_consumer.cache.snapshot_count
        warning = self._subject_warning.observe(subjects, snapshots)
        if warning is not None:
            log.warning("%s", warning)
        raw = self.getStatus()
        transport = self._SyncObj__transport
        # pysyncobj keeps the last leader it saw while it is connected to no one (it
        # holds no election then): without a quorum of connections there is no leader
        leader = raw.get("leader") if raw.get("has_quorum") else None
        self.status_snapshot = RaftStatus(
            state={0: "follower", 1: "candidate", 2: "leader"}.get(raw.get("state"), "?"),
            leader=None if leader is None else str(leader),
            term=int(raw.get("raft_term") or 0),
            commit_index=int(raw.get("commit_idx") or 0),
            last_applied=int(raw.get("last_applied") or 0),
            leader_commit=int(raw.get("leader_commit_idx") or 0),
            ready=bool(self.isReady()),
            clsn=coordinator.clsn,
            digest=self._digest,
            at=now,
            linked=tuple(sorted(str(n.id) for n in self.otherNodes if self.isNodeConnected(n))),
            seeds=tuple(sorted(str(n.id) for n in self.otherNodes)),
            unresolved=self._unresolved_seeds(now),
            started=self._started,
            front=transport.front_statistics(),
            listen_error=transport.listen_error(),
            refused_by=transport.refused_by(),
            stopped=self.stopped,
            dump_failures=self._dump_retries.total,
            subjects=subjects,
            snapshots=snapshots,
            forward_hold=self.forward_hold.statistics(),
            dumps_untaken=self._untaken_dumps.untaken(),
            dump_unloadable=self._unloadable.reason,
            entries_taken=self._entries_taken,
            held=len(self._status_consumer.held),
            held_since=self._status_consumer.held_since,
        )


DEFAULT_TIMINGS = RaftTimings()  # (cluster/raft_timings.py: ClusterElectionTimeout)

MIN_FREE_BYTES = 1 << 20
"""Room a seed's ClusterDataDir must have at start: its journal's first doublings, the
term-and-vote file, the dump of a small cluster. With less (a full disk: the touch of
``.writable`` still works) the seed used to pass the start-up check, wait for the other
seeds, then stop on its first write (``cannot write .../raft.journal.empty-start (No
space left on device)``), naming a file, not the key."""


def journal_files(data_dir: Path | None) -> dict[str, str]:
    """pysyncobj's journal (log, term, vote) and its compaction dump under ``data_dir``."""
    if data_dir is None:
        return {}
    try:  # (exists() too: a parent this user may not search raised from it, unnamed)
        if data_dir.exists() and not data_dir.is_dir():  # (mkdir's word: "File exists")
            raise NotADirectoryError(errno.ENOTDIR, "not a directory")
        data_dir.mkdir(parents=True, exist_ok=True)
        (data_dir / ".writable").touch()
        free = shutil.disk_usage(data_dir).free
    except OSError as exc:
        raise OSError(exc.errno, f"ClusterDataDir {data_dir}: {exc.strerror}"
                      f"{f' ({ACCESS_REMEDY})' if exc.errno in ACCESS_ERRORS else ''}") from exc
    if free < MIN_FREE_BYTES:  # (an empty file is created on a full disk: say it now)
        raise OSError(errno.ENOSPC, f"ClusterDataDir {data_dir}: {os.strerror(errno.ENOSPC)} "
                      f"({free} bytes free; a seed needs {MIN_FREE_BYTES} at least)")
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
        on_restore: Callable[[CacheSync], None] | None = None,
        on_state_changed: Callable[[], None] | None = None,
        timings: RaftTimings = DEFAULT_TIMINGS,
        data_dir: Path | None = None,
        max_cached_messages: int = 1000,
        cache_budget: int = 0,
    ) -> None:
        """``data_dir`` keeps the Raft log, term and vote across restarts (``None``: memory
        only, for tests of a single process lifetime). ``bind_address`` is where the
        cluster port really listens (``ClusterMemberBind``); ``None``: ``self_address``,
        so the Raft port (its port + 1) listens on that host only -- never on every
        interface, pysyncobj's default, which tests on 127.0.0.1 and a member behind a
        named address must not get by leaving it out. Builds and starts pysyncobj, which
        loads its journal and dump: call it off the event loop (``trio.to_thread``)."""
        if not password:
            raise ValueError("Raft must never run without a password (pickle on the wire)")
        dump_fork.register()  # pysyncobj's dump child holds none of our ports
        self.consumer = CoordinationConsumer(
            on_commit, on_restore, max_cached_messages, cache_budget
        )
        me = raft_address(self_address)
        others = [raft_address(a) for a in seed_addresses if a != self_address]
        stagger = compaction_stagger(me)  # cluster/raft_compaction.py
        conf = SyncObjConf(
            password=password,
            raftMinTimeout=timings.election_min,
            raftMaxTimeout=timings.election_max,
            appendEntriesPeriod=timings.heartbeat,
            connectionTimeout=timings.connection_timeout,
            connectionRetryTime=timings.reconnect,
            # a restarted pod comes back with a new IP under the same name: pysyncobj's
            # default (600 s) kept dialling the old one, and a seed restarted after two
            # others stayed cut off (tests/deploy/rehearsal.py found it); a dial that
            # gets no answer ends after connectionTimeout (cluster/raft_transport.py)
            dnsCacheTime=DNS_CACHE_SECONDS,
            dnsFailCacheTime=DNS_CACHE_SECONDS,
            appendEntriesUseBatch=timings.use_batch,
            leaderFallbackTimeout=max(1.0, 4 * timings.election_max),
            commandsWaitLeader=True,
            onStateChanged=lambda _old, _new: self._state_changed(on_state_changed),
            # each seed its own thresholds: no two fork their dump writers together
            logCompactionMinEntries=int(timings.compaction_entries * stagger),
            logCompactionMinTime=timings.compaction_seconds * stagger,
            bindAddress=raft_address(bind_address or self_address),
            **journal_files(data_dir),
        )
        bound_log_bytes(conf, int(timings.compaction_bytes * stagger))
        self.address = me
        self._closed = False
        self.syncobj = _SeedSyncObj(
            me, others, conf=conf, consumer=self.consumer, transportClass=SeedLinkTransport,
            link_wait=timings.link_wait,
        )
        # pysyncobj's tick thread stops for good, silently, once the thread that built
        # the SyncObj has ended (it takes that one for the "main thread"). This is built
        # in a trio worker thread, which trio ends after ~10 s idle: point it at the
        # process's main thread (tests/cluster/test_raft_thread.py pins both).
        self.syncobj._SyncObj__mainThread = threading.main_thread()
        if data_dir is not None:
            log.info(
                "Raft state in %s: term %s, commit index %s",
                data_dir,
                self.syncobj.raftCurrentTerm,
                self.syncobj.raftCommitIndex,
            )

    def _state_changed(self, then: Callable[[], None] | None) -> None:
        syncobj = getattr(self, "syncobj", None)
        if syncobj is not None:
            syncobj.publish_status(time.monotonic())
        if then is not None:
            then()

    @property
    def snapshot(self) -> RaftStatus:
        """The Raft thread's last published status (never reads pysyncobj from here)."""
        status: RaftStatus = self.syncobj.status_snapshot
        return status

    def submit(
        self,
        epoch_candidate: int,
        requests: Sequence[PublishRequest],
        on_done: Callable[[int | None, str | None, bool], None],
        *,
        send_by: float | None = None,
    ) -> None:
        """Replicate one batch; ``on_done(clsn, error, unknown)`` on the pysyncobj thread.
        ``send_by`` (``time.monotonic``): if the link to the leader is down, the batch is
        held until then at most, and never sent after it (cluster/raft_forward.py)."""

        def answer(result: Any, error: int) -> None:
            if error == FAIL_REASON.SUCCESS:
                on_done(int(result), None, False)
            else:
                on_done(None, _fail_name(error), error not in DEFINITE_FAILURES)

        def callback(result: Any, error: int) -> None:  # after the batches held before it
            self.consumer.in_order(lambda: answer(result, error))

        if self._closed or self.syncobj.stopped is not None:  # handles no command again:
            on_done(None, CLOSED_NAME, False)  # (the member is stopping; its links still
            return  # hand in forwards)
        wire = to_wire(requests)
        try:
            if send_by is None:
                self.consumer.commit_batch(epoch_candidate, wire, callback=callback)
            else:
                self.consumer.commit_batch(
                    epoch_candidate, wire, callback=SendBy(callback, send_by)
                )
        except AttributeError:  # closed between the look above and pysyncobj's
            if not self._closed:
                raise
            on_done(None, CLOSED_NAME, False)

    def status(self) -> dict[str, Any]:
        snap = self.snapshot
        return {
            "raft_address": self.address,
            "raft_state": snap.state,
            "raft_leader": snap.leader,
            "raft_term": snap.term,
            "raft_commit_index": snap.commit_index,
            "raft_last_applied": snap.last_applied,
            "raft_leader_commit": snap.leader_commit,
            "raft_ready": snap.ready,
            "clsn": snap.clsn,
            "coordinator_digest": snap.digest,
            "raft_linked_seeds": list(snap.linked),
            "raft_front": asdict(snap.front),
            "raft_listen_error": snap.listen_error,
            "raft_refused_by": list(snap.refused_by),
            "raft_stopped": snap.stopped,
            "raft_dump_failures": snap.dump_failures,
            "raft_subjects": snap.subjects,
            "raft_snapshots": snap.snapshots,
            "raft_forward_hold": dict(snap.forward_hold),
            "raft_dumps_untaken": dict(snap.dumps_untaken),
            "raft_dump_unloadable": snap.dump_unloadable,
            # read now, not from the snapshot: a sync under way stops the Raft thread
            "raft_disk": asdict(raft_slow_disk.SYNCS.statistics()),
        }

    @property
    def closed(self) -> bool:
        """Whether :meth:`close` began: every submit from then on is refused."""
        return self._closed

    def close(self) -> None:
        """Stop the Raft node; a submit from now on is answered :data:`CLOSED_NAME`
        (never sent) at once: pysyncobj's replicated methods fail once it is destroyed."""
        self._closed = True
        self.consumer.closing = True  # (a journal being replayed: the rest is left)
        self.syncobj.destroy_synchronous()
        left = self.syncobj._SyncObj__raftCommitIndex - self.syncobj._SyncObj__raftLastApplied
        if left > 0:
            log.info("Raft node closed with %d committed entries not applied yet (they are in "
                     "its journal)", left)


def _fail_name(code: int) -> str:
    if code == NOT_SENT:
        return NOT_SENT_NAME
    for name in dir(FAIL_REASON):
        if not name.startswith("_") and getattr(FAIL_REASON, name) == code:
            return name
    return f"FAIL_{code}"
