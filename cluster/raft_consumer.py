"""The seeds' replicated state machine, as pysyncobj's consumer: numbering and caches.

:class:`CoordinationConsumer` holds the :class:`~cluster.coordination.Coordinator` and the
:class:`~cluster.replicated_cache.ReplicatedCache`; pysyncobj applies each committed batch
to it on its Raft thread (``commit_batch``) and dumps it at log compaction.

A dump's numbering and caches decode in threads of their own (:mod:`cluster.dump_decoder`:
on the Raft thread, a million subjects' numbering was ~2 s in which the seed answered no
AppendEntries and no vote). The caches keep what they are given meanwhile; the numbering
cannot number a batch before it is decoded, so the consumer **holds** the batches Raft
commits meanwhile (``held``, in commit order, part of the replicated state: a dump written
meanwhile carries them) and applies them once it is decoded, a slice at a time
(:meth:`CoordinationConsumer.catch_up`, called at each Raft tick, :data:`HELD_SLICE` at
most). Everything a batch causes keeps its order: its ``on_commit``, and the answers to
the submitters (:meth:`CoordinationConsumer.in_order`: a seed's barrier, answered before
the batches in front of it were handed to its hub, would have failed publishes that
committed, ``cluster/raft_outcomes.py``).

Pure apart from the decoding threads: no trio, no sockets.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable, Sequence
from typing import Any

from pysyncobj import SyncObjConsumer, replicated

from cluster import raft_unpickler
from cluster.cache_sync import CacheSync
from cluster.coordination import CommittedBatch, Coordinator, PublishRequest
from cluster.replicated_cache import ReplicatedCache
from migratory.model.message import Message, Qos

__all__ = ["HELD_SLICE", "CoordinationConsumer", "WireRequest", "from_wire", "to_wire"]

# (origin, ref, subject, content, fields, retained, guaranteed): plain tuples pickle fast
WireRequest = tuple[str, int, str, bytes, dict[str, str], bool, bool]

HELD_SLICE = 0.02
"""Seconds of held batches a Raft tick applies at most (at least one batch): well under
the election timeout (0.15 s), so the thread that answers the leader keeps ticking."""


def to_wire(requests: Sequence[PublishRequest]) -> list[WireRequest]:
    return [
        (
            r.origin,
            r.ref,
            r.message.subject,
            r.message.content or raft_unpickler.EMPTY_CONTENT,  # (read by 524f73f too)
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


class RaftClosing(Exception):
    """The member closes its Raft node (it is stopping): the committed entries not
    applied yet stay so -- they are in the journal, and the process exits. Raised before
    an entry changes anything, so Raft does not count it applied."""


class CoordinationConsumer(SyncObjConsumer):  # type: ignore[misc]
    """The replicated state machine: ``coordinator``, ``cache`` and ``held`` are
    replicated (and dumped at log compaction); the callbacks and the answers waiting
    behind held batches, set before ``SyncObjConsumer.__init__``, are not."""

    def __init__(
        self,
        on_commit: Callable[[CommittedBatch], None],
        on_restore: Callable[[CacheSync], None] | None = None,
        max_cached_messages: int = 1000,
        cache_budget: int = 0,
    ) -> None:
        self._on_commit = on_commit
        self._on_restore = on_restore
        self._cache_budget = cache_budget
        self._answers: deque[tuple[int, Callable[[], None]]] = deque()
        self._taken = 0  # held batches applied (or dropped) since start: answers' marks
        self.held_applied = 0  # of them, those applied (a count for tests and benchmarks)
        self.held_since: float | None = None
        """``time.monotonic`` when batches began to be held (None: none held): the
        hub gets nothing new meanwhile though Raft counts them applied (readiness)."""
        self.closing = False
        """Set by :meth:`cluster.raft.RaftCoordination.close`: apply nothing more. A seed
        stopped while it replayed a long journal at start-up applied all of it first
        (its Raft thread applies every committed entry in one tick): 2.4-4.8 s of exit
        after a SIGTERM, 140,000 messages' journal (tests/cluster/test_raft_thread.py)."""
        super().__init__()
        self.coordinator = Coordinator()
        self.cache = ReplicatedCache(max_cached_messages, cache_budget)
        self.held: deque[tuple[int, list[WireRequest]]] = deque()

    @replicated  # type: ignore[untyped-decorator]
    def commit_batch(self, epoch_candidate: int, wire: list[WireRequest]) -> int:
        if self.closing:
            raise RaftClosing
        if self.held or self.coordinator.decoding:  # numbered once it is decoded
            if not self.held:
                self.held_since = time.monotonic()
            self.held.append((epoch_candidate, wire))
            return self.coordinator.clsn + len(self.held)
        return self._apply(epoch_candidate, wire)

    def _apply(self, epoch_candidate: int, wire: list[WireRequest]) -> int:
        batch = self.coordinator.apply_wire(epoch_candidate, wire)
        self.cache.append(batch.messages)
        self._on_commit(batch)
        clsn: int = batch.clsn
        return clsn

    def in_order(self, answer: Callable[[], None]) -> None:
        """Run ``answer`` (a submitter's) now, or once the batches held now are applied."""
        if self.held:
            self._answers.append((self._taken + len(self.held), answer))
        else:
            answer()

    def catch_up(self, until: float | None = None) -> bool:
        """Take the dump's numbering once decoded and apply the batches held meanwhile,
        until ``time.monotonic`` passes ``until`` (None: all; at least one); whether held
        batches are left that could be applied now (the numbering is here).
        :class:`~cluster.dump_decoder.DumpDecodeError` if the numbering does not decode."""
        held = self.held
        if not self.coordinator.settle(wait=False):
            return False  # (nothing to do before it is decoded)
        while held:
            self._apply(*held.popleft())
            self._taken += 1
            self.held_applied += 1
            self._answer_due()
            if until is not None and time.monotonic() >= until:
                break
        if not held:
            self.held_since = None
        return bool(held)

    def _answer_due(self) -> None:
        answers = self._answers
        while answers and answers[0][0] <= self._taken:
            answers.popleft()[1]()

    def _deserialize(self, data: dict[str, Any]) -> None:
        """pysyncobj loaded a dump (ours at start-up, or the leader's): the state jumped
        to the dump's batch; hand its caches to the member before any later batch.

        Batches still held are dropped (the dump is a later state: it holds them), and
        the answers waiting behind them are given."""
        self._taken += len(self.held)
        self.held = deque()  # (a dump of the code before has none)
        super()._deserialize(data)
        self.held = deque(self.held)
        self.held_since = time.monotonic() if self.held else None
        self.cache.set_budget(self._cache_budget)  # this seed's, not the dump writer's
        self.cache.begin_decoding()  # off this thread (cluster/dump_decoder.py)
        coordinator = self.coordinator
        coordinator.begin_decoding()
        if self._on_restore is not None:  # (no record built here: DumpRecords)
            self._on_restore(self.cache.to_sync(coordinator.clsn, coordinator.positions_now()))
        self._answer_due()

    def _serialize(self) -> dict[str, Any]:
        """The dumped state (on the Raft thread; pickled by the dump's writer): the held
        batches as a list (the dump's unpickler takes plain types)."""
        data: dict[str, Any] = super()._serialize()
        data["held"] = list(self.held)
        return data
