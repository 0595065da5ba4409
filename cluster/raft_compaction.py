"""A leader does not compact its log while its dump is on its way to a follower.

A seed too far behind the leader's log (it was down or cut off while the leader
compacted) can only catch up from the leader's dump, sent in parts over several rounds.
pysyncobj 0.3.17 drops every transmission in progress whenever the leader finishes a
new dump (``Serializer.checkSerializing``: ``__transmissions = {}``), and sends nothing
to anyone while it writes one. A leader that compacts more often than a dump takes to
send -- a large state, a slow link, or small ``ClusterLogCompactionEntries`` under
load -- restarts the same follower's transmission for ever: the seed never catches up,
keeps starting elections, and deposes leaders (``tests/cluster/test_raft_compaction.py``
shows it on real pysyncobj nodes: 6,400 parts sent, no dump ever installed).

:class:`CompactionWaitsForDumps` starts no new compaction on a leader while a dump
transmission is in progress, for at most :data:`MAX_WAIT_SECONDS` (and while its log
holds no more than :data:`MAX_LOG_FACTOR` times ``logCompactionMinEntries``, nor
that many times ``ClusterLogCompactionBytes``), so a
transmission that can finish does; a follower that never takes its parts cannot keep
the log growing for ever.

Seeds do not compact at the same moment. Each seed holds the same log, so with the
same thresholds all of them reached them at the same index and forked their dump
writers together: three parents taking copy-on-write faults and three children
pickling on the same cores stalled every member at once, and the acknowledgements of
that second waited 30-50 ms (the p99.9 of benchmarks/cluster_ack_latency.py, whose
20 s windows each held a compaction). :func:`compaction_stagger` gives each seed its
own factor between 1 and 1 + :data:`STAGGER` on both thresholds, fixed by its address:
with one seed compacting at a time, the other two still commit, and the leader's own
compaction stalled nothing measurable (traced: p99.9 9.5 ms in a window with all three
compactions, 8 s apart).

Seeds compact once their log takes more than ``ClusterLogCompactionBytes`` too
(:func:`bound_log_bytes`). pysyncobj's journal keeps every entry in memory as well as on
disk until a compaction drops it, and its thresholds count entries and seconds only:
at 10,000 acknowledged 100-byte publishes a second a seed's memory grew 310 bytes a
publish with its message caches bounded (``benchmarks/raft_log_memory.py``), about
1 GB over one ``ClusterLogCompactionTime`` at the cluster's ceiling -- beyond every
budget, and the three seeds hold the same log (the OOM killer takes them together).

Once the dump is written, the journal drops the entries it holds in one step
(:func:`trimmed`). pysyncobj 0.3.17 rewrote the journal in place -- the header's end of
records set back to the start, then each kept entry added again -- so a seed killed
during that rewrite (thousands of entries under load) restarted with only the first of
the entries after the dump: a shorter log than it had acknowledged, without a word
(``tests/cluster/test_raft_compaction.py``). A trim that fails is a
:class:`~cluster.raft_disk.RaftDiskFailure`: the seed stops (by then the old journal may
be closed; a raw ``OSError`` left every later tick failing on it).
"""

from __future__ import annotations

import contextlib
import logging
import os
import random
from typing import Any

from pysyncobj import SyncObj
from pysyncobj import syncobj as pysyncobj_syncobj
from pysyncobj.journal import FIRST_RECORD_OFFSET, FileJournal
from pysyncobj.syncobj import _RAFT_STATE

from cluster import raft_durability
from cluster.raft_disk import RaftDiskFailure

log = logging.getLogger("migratory.raft")

MAX_WAIT_SECONDS = 60.0
MAX_LOG_FACTOR = 4
STAGGER = 0.5
LOG_BYTES_SETTING = "logCompactionMinBytes"
"""The ``SyncObjConf`` attribute (ours: pysyncobj has none) with the log's byte bound."""


def bound_log_bytes(conf: Any, limit: int) -> None:
    """Compact once the log's entries take more than ``limit`` bytes (0: no bound)."""
    setattr(conf, LOG_BYTES_SETTING, limit)


def log_bytes(journal: Any) -> int:
    """The bytes of the entries in pysyncobj's file journal (its records: O(1)); 0 for
    a journal in memory (a seed without ClusterDataDir, tests)."""
    if isinstance(journal, FileJournal):
        return int(journal._FileJournal__currentOffset) - int(FIRST_RECORD_OFFSET)
    return 0


def compaction_stagger(address: str) -> float:
    """This seed's factor on ``ClusterLogCompactionEntries`` and ``...Time``: between 1
    and 1 + STAGGER, the same for an address on every start, different across seeds."""
    return 1.0 + STAGGER * random.Random(address).random()


TRIM_SUFFIX = ".trim"


def trimmed(journal: FileJournal, drop: int, path: str) -> FileJournal:
    """``journal`` (pysyncobj's file journal at ``path``) without its first ``drop``
    entries, written whole to ``path`` + :data:`TRIM_SUFFIX` and renamed over ``path``: a
    process killed at any moment leaves the old journal or the new one, never a part."""
    journal.onOneSecondTimer()  # the term, vote and commit index on disk (the .meta file)
    kept = journal[drop:]
    temporary = path + TRIM_SUFFIX
    try:  # any failure stops the seed (the old journal may be closed already)
        with contextlib.suppress(FileNotFoundError):
            os.remove(temporary)  # a trim killed before
        trim = FileJournal(temporary)  # (no .meta of its own: it never stores one)
        for entry in kept:
            trim.add(*entry)
        raft_durability.journal_durable(trim)  # whole on the disk before it is the journal
        trim._destroy()
        journal._destroy()
        os.replace(temporary, path)
        raft_durability.synced_directory(os.path.dirname(path))
    except OSError as exc:  # (the trim's writes; the rename, the directory's sync: EIO)
        with contextlib.suppress(OSError):
            os.remove(temporary)  # its space back for the restart (a full disk)
        if isinstance(exc, RaftDiskFailure):
            raise
        raise RaftDiskFailure(path, exc) from exc
    return FileJournal(path)


class CompactionWaitsForDumps(SyncObj):  # type: ignore[misc]
    """``SyncObj`` whose leader postpones compaction while a dump is being sent."""

    _SyncObj__serializer: Any
    _SyncObj__raftState: int
    _SyncObj__raftLog: Any
    _SyncObj__conf: Any

    _waiting_since: float | None = None  # class default: set before SyncObj.__init__ runs

    def _SyncObj__deleteEntriesTo(self, to_index: int) -> None:
        """The journal without its entries before ``to_index`` (the dump holds them)."""
        journal = self._SyncObj__raftLog
        drop = to_index - journal[0][1]
        if drop <= 0:
            return
        if isinstance(journal, FileJournal):
            self._SyncObj__raftLog = trimmed(journal, drop, self._SyncObj__conf.journalFile)
        else:
            journal.deleteEntriesTo(drop)

    def _SyncObj__tryLogCompaction(self) -> None:
        if self._dump_on_its_way():
            return
        if self._log_over(1):  # pysyncobj's entries and seconds do not bound the bytes
            self._SyncObj__forceLogCompaction = True
        SyncObj._SyncObj__tryLogCompaction(self)

    def _log_over(self, factor: int) -> bool:
        """The log takes more than ``factor`` times ``ClusterLogCompactionBytes``."""
        limit = getattr(self._SyncObj__conf, LOG_BYTES_SETTING, 0)
        return bool(limit) and log_bytes(self._SyncObj__raftLog) > factor * limit

    def _dump_on_its_way(self) -> bool:
        """True while compaction should wait: this leader is sending its dump and is not
        writing one (a finished dump still gets its journal trimmed)."""
        serializer = self._SyncObj__serializer
        if self._SyncObj__raftState != _RAFT_STATE.LEADER:
            self._forget_transmissions(serializer)
        sending = (
            self._SyncObj__raftState == _RAFT_STATE.LEADER
            and serializer._Serializer__pid == 0
            and bool(serializer._Serializer__transmissions)
        )
        if not sending:
            self._waiting_since = None
            return False
        now = pysyncobj_syncobj.monotonicTime()  # the Raft clock (simulated in tests)
        if self._waiting_since is None:
            self._waiting_since = now
        conf = self._SyncObj__conf
        if (
            now - self._waiting_since > MAX_WAIT_SECONDS
            or len(self._SyncObj__raftLog) > MAX_LOG_FACTOR * conf.logCompactionMinEntries
            or self._log_over(MAX_LOG_FACTOR)
        ):
            log.warning(
                "Raft: compacting the log although a dump is still being sent to "
                "%d follower(s) (waited %.0f s, %d entries, %d bytes)",
                len(serializer._Serializer__transmissions), now - self._waiting_since,
                len(self._SyncObj__raftLog), log_bytes(self._SyncObj__raftLog),
            )
            self._waiting_since = None
            return False
        return True

    @staticmethod
    def _forget_transmissions(serializer: Any) -> None:
        """A node that no longer leads drops the dump transmissions it had begun.

        pysyncobj keeps them (it cancels one only when it sends as leader to a follower
        that is disconnected): led again, the node would resume a follower's stale
        transmission where it stopped, and wait up to :data:`MAX_WAIT_SECONDS` for it
        before compacting (``tests/cluster/test_raft_compaction.py``).
        """
        transmissions = serializer._Serializer__transmissions
        for transmission in transmissions.values():
            if "file" in transmission:
                transmission["file"].close()
        transmissions.clear()
