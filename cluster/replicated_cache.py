"""The message caches as part of the seeds' replicated state, so a Raft dump carries them.

Pure and deterministic. pysyncobj compacts a seed's log into a dump of the replicated
state; a seed that restarts from that dump (or a follower sent the leader's dump)
never sees the batches the dump replaced. If the dump held only the numbering, the
seed would have positions without messages and would need a peer's caches -- and
when every seed restarts after a compaction, no peer has them: a permanent outage.

So the replicated state holds, next to the :class:`~cluster.coordination.Coordinator`,
each subject's snapshot and its last ``max_messages`` messages, updated in the same
step as the numbering (on the Raft thread, in commit order). A dump is then a
complete :class:`~cluster.cache_sync.CacheSync` as of the dump's batch, identical on
every seed. Cached messages are kept packed (:func:`~migratory.model.message.pack`,
tuples the garbage collector stops tracking): as ``Message`` objects, a seed's
50,000 cached messages made every full collection stop it for ~180 ms. Unlike the
hub's cache there is no time-based expiry here (a seed restored from a dump may
recover more than ``CacheExpireTime`` back, never less).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable
from typing import Any

from cluster.cache_sync import CacheSync, SubjectSync
from migratory.model.message import PACKED_EPOCH, Message, PackedMessage, pack, unpack
from migratory.model.snapshot import merge_snapshot

__all__ = ["ReplicatedCache"]


class ReplicatedCache:
    """Per subject: its snapshot and last ``max_messages`` committed messages."""

    __slots__ = ("_cached", "_max_messages", "_snapshots")

    def __init__(self, max_messages: int = 1000) -> None:
        if max_messages < 0:
            raise ValueError(f"max_messages must be >= 0, got {max_messages}")
        self._max_messages = max_messages
        self._cached: dict[str, deque[PackedMessage]] = {}
        self._snapshots: dict[str, Message] = {}

    def __repr__(self) -> str:
        return f"<ReplicatedCache {len(self._cached)} subjects, max {self._max_messages}>"

    def append(self, messages: Iterable[Message]) -> None:
        """Committed, numbered messages, in commit order."""
        cached, snapshots, limit = self._cached, self._snapshots, self._max_messages
        for message in messages:
            subject = message.subject
            queue = cached.get(subject)
            if queue is None:
                queue = cached[subject] = deque(maxlen=limit)
            elif queue and queue[-1][PACKED_EPOCH] != message.epoch:
                queue.clear()  # a new lineage: older messages are not its history
                snapshots.pop(subject, None)
            queue.append(pack(message))
            if message.retained:
                merged = merge_snapshot(snapshots.get(subject), message)
                if merged is not None:
                    snapshots[subject] = merged

    def to_sync(self, clsn: int, positions: dict[str, tuple[int, int]]) -> CacheSync:
        """The caches as a cache sync after batch ``clsn``; ``positions`` maps each
        numbered subject to its ``(epoch, seq)`` (a subject whose messages are all
        evicted, ``max_messages = 0``, still has a position)."""
        subjects = []
        for subject, (epoch, seq) in positions.items():
            queue = self._cached.get(subject)
            cached = (
                tuple(map(unpack, queue)) if queue and queue[-1][PACKED_EPOCH] == epoch else ()
            )
            snapshot = self._snapshots.get(subject)
            if snapshot is not None and snapshot.epoch != epoch:
                snapshot = None
            subjects.append(SubjectSync(subject, epoch, seq, snapshot, cached))
        return CacheSync(clsn, tuple(subjects))

    # pickled into pysyncobj's dump: plain tuples, no deques (a dump written before the
    # cache was packed holds Message objects: they are packed on load)
    def __getstate__(self) -> dict[str, Any]:
        return {
            "max_messages": self._max_messages,
            "cached": {s: tuple(q) for s, q in self._cached.items()},
            "snapshots": dict(self._snapshots),
        }

    def __setstate__(self, state: dict[str, Any]) -> None:
        self._max_messages = state["max_messages"]
        self._cached = {
            s: deque(
                (pack(m) if isinstance(m, Message) else m for m in messages),
                maxlen=self._max_messages,
            )
            for s, messages in state["cached"].items()
        }
        self._snapshots = dict(state["snapshots"])
