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
recover more than ``CacheExpireTime`` back, never less); what bounds it, beside the
count per subject, is ``CacheMemoryBudget`` (:mod:`migratory.model.cache_budget`):
without it a seed kept ~360 bytes for each of the last 1,000 messages of every subject
ever published, for ever. The budget drops the oldest messages in commit order, so every
seed drops the same ones, and its order goes into the dump with the caches.
"""

from __future__ import annotations

import functools
import operator
from collections import deque
from collections.abc import Iterable, Iterator, Mapping, Sequence
from typing import Any, overload

from cluster.cache_sync import CacheSync, SubjectSync
from cluster.dump_decoder import DumpDecoding, encode
from migratory.model.cache_budget import (
    ENTRY_OVERHEAD,
    QUEUE_OVERHEAD,
    BudgetedQueue,
    CacheBudget,
)
from migratory.model.message import (
    PACKED_EPOCH,
    Message,
    PackedMessage,
    pack,
    packed_size,
    packed_sizes,
    unpack,
)
from migratory.model.snapshot import merge_snapshot
from migratory.model.untracked import untrack

__all__ = ["DumpRecords", "ReplicatedCache", "packed_size"]



class _Queue(deque[PackedMessage]):
    """One subject's cached messages, oldest first, as the budget sees them.

    Untracked by the garbage collector (:mod:`migratory.model.untracked`): it holds
    packed messages (tuples of atoms) and two atoms, and ``emptied``, a list that holds
    queues only between a budget's eviction and :meth:`ReplicatedCache._forget_emptied`
    -- no cycle through it outlives one ``append``. (It held the dict of queues, a cycle
    with every queue: untracked, a dropped cache would never have been freed.)"""

    __slots__ = ("emptied", "fifo_entries", "fifo_key", "stale", "subject")

    def __init__(
        self, subject: str, maxlen: int, emptied: list[_Queue],
        items: Iterable[PackedMessage] = (),
    ) -> None:
        super().__init__(items, maxlen=maxlen)
        self.subject = subject
        self.emptied = emptied
        self.stale = self.fifo_key = self.fifo_entries = 0
        untrack(self)

    def drop_oldest(self) -> int:
        """The budget's drop; a queue it empties leaves the caches (an empty deque is
        ~760 bytes: a million subjects emptied by the budget would be 760 MB of them) once
        the eviction is over. It has no entry left in the budget's FIFO then: its stale
        ones came first."""
        if not self:
            return 0
        size = packed_size(self.popleft())
        if not self:
            self.emptied.append(self)
            size += QUEUE_OVERHEAD
        return size


class DumpRecords(Sequence[SubjectSync]):
    """The subjects of a cache sync taken from a :class:`ReplicatedCache`, built when read.

    It holds what it was given -- positions, each subject's packed messages, the
    snapshots -- and nothing of the cache it came from, which may change meanwhile
    (positions may be a :class:`~cluster.coordination.NumberedPositions`). Each read
    builds the records again: a reader that needs them twice keeps them (the sliced
    install does, :class:`~cluster.cache_sync.SyncInstall`).

    The messages and snapshots may still be decoding (``later``, a dump's caches
    decoded off the Raft thread, :mod:`cluster.dump_decoder`): :meth:`ready` says
    whether a read would wait for them."""

    __slots__ = ("_cached", "_later", "_names", "_positions", "_snapshots")

    def __init__(
        self,
        positions: Mapping[str, tuple[int, int]],
        cached: Mapping[str, tuple[PackedMessage, ...]],
        snapshots: Mapping[str, Message],
        later: DumpDecoding[_Decoded] | None = None,
    ) -> None:
        self._positions = positions
        self._cached = cached
        self._snapshots = snapshots
        self._later = later
        self._names: list[str] | None = None  # for indexing, made at the first

    def ready(self) -> bool:
        """Whether the messages and positions are here (else a read waits for their
        decoding: the positions may be a dump's numbering, still decoding too)."""
        positions_ready = getattr(self._positions, "ready", None)
        return (self._later is None or self._later.done()) and (
            positions_ready is None or bool(positions_ready()))

    def record(self, subject: str) -> SubjectSync:
        if self._later is not None:  # DumpDecodeError if they do not decode
            _, self._cached, self._snapshots = self._later.result()
            self._later = None
        epoch, seq = self._positions[subject]
        queue = self._cached.get(subject)
        cached = (
            tuple(map(unpack, queue)) if queue and queue[-1][PACKED_EPOCH] == epoch else ()
        )
        # the subject's snapshot whatever its epoch: the one rule, merge_snapshot's
        return SubjectSync(subject, epoch, seq, self._snapshots.get(subject), cached)

    def __iter__(self) -> Iterator[SubjectSync]:
        return map(self.record, self._positions)

    def __len__(self) -> int:
        return len(self._positions)

    @overload
    def __getitem__(self, index: int) -> SubjectSync: ...

    @overload
    def __getitem__(self, index: slice) -> tuple[SubjectSync, ...]: ...

    def __getitem__(self, index: int | slice) -> SubjectSync | tuple[SubjectSync, ...]:
        if self._names is None:
            self._names = list(self._positions)
        if isinstance(index, slice):
            return tuple(map(self.record, self._names[index]))
        return self.record(self._names[index])

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Sequence):
            return NotImplemented
        return len(self) == len(other) and all(map(operator.eq, self, other))

    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        return f"<DumpRecords of {len(self)} subjects>"


class _Decoding:
    """A dump's caches decoding (:mod:`cluster.dump_decoder`) and what the cache was
    given meanwhile, in order (``ops``): the decoding applies those handed to it (given
    before it began), the cache the rest once it takes the decoded caches."""

    __slots__ = ("decoding", "ops", "snapshot_count")

    def __init__(self, decoding: DumpDecoding[_Decoded], snapshot_count: int) -> None:
        self.decoding = decoding
        self.snapshot_count = snapshot_count
        """The dump's, said while its caches decode."""
        self.ops: list[tuple[str, Any]] = []

    def hand_over(self) -> None:
        """The ops so far go to the decoding (which has not begun)."""
        self.decoding.handed = tuple(self.ops)

    @property
    def after_handed(self) -> list[tuple[str, Any]]:
        return self.ops[len(self.decoding.handed):]


class ReplicatedCache:
    """Per subject: its snapshot and last ``max_messages`` committed messages, all of
    them within ``budget_bytes`` (0: no budget).

    Loaded from a dump, its caches decode in a thread of their own once
    :meth:`begin_decoding` is called (the Raft thread loads the dump: it must not spend
    ~0.5 s there, :mod:`cluster.dump_decoder`); what it is given meanwhile
    (:meth:`append`, :meth:`set_budget`) is kept and applied in the same order to the
    decoded caches, when the Raft thread next appends or calls :meth:`settle`. Anything
    else that reads the caches waits for them (a dump's writer decodes them itself)."""

    __slots__ = ("_budget", "_cached", "_decoding", "_emptied", "_max_messages", "_snapshots")

    def __init__(self, max_messages: int = 1000, budget_bytes: int = 0) -> None:
        if max_messages < 0:
            raise ValueError(f"max_messages must be >= 0, got {max_messages}")
        self._max_messages = max_messages
        self._cached: dict[str, _Queue] = {}
        self._emptied: list[_Queue] = []
        self._snapshots: dict[str, Message] = {}
        self._budget = CacheBudget(budget_bytes) if budget_bytes else None
        self._decoding: _Decoding | None = None

    def __repr__(self) -> str:
        if self._decoding is not None:
            return f"<ReplicatedCache decoding, max {self._max_messages}>"
        return f"<ReplicatedCache {len(self._cached)} subjects, max {self._max_messages}>"

    @property
    def budget(self) -> CacheBudget | None:
        self._settle()
        return self._budget

    @property
    def snapshot_count(self) -> int:
        """Subjects holding a snapshot (kept for ever, like the numbering); the dump's
        count while its caches decode."""
        decoding = self._decoding
        return len(self._snapshots) if decoding is None else decoding.snapshot_count

    @property
    def decoding(self) -> bool:
        """Whether this cache waits for a dump's caches (see the class docstring)."""
        return self._decoding is not None

    def begin_decoding(self) -> None:
        """Decode the dump's caches in a thread of their own from now on (nothing to do
        for a cache not loaded from a dump, or from a dump of the code before)."""
        decoding = self._decoding
        if decoding is not None and not decoding.decoding.begun:
            decoding.hand_over()
            decoding.decoding.begin()

    def settle(self) -> None:
        """Take the dump's decoded caches if they are ready (never waits for them);
        :class:`~cluster.dump_decoder.DumpDecodeError` if they did not decode."""
        self._settle(wait=False)

    def _settle(self, wait: bool = True) -> bool:
        """Take the decoded caches (waiting for them if ``wait``; decoding them here if
        no thread does) and apply what came since; whether this cache has its own."""
        decoding = self._decoding
        if decoding is None:
            return True
        later = decoding.decoding
        if not wait and not later.done():
            return False
        if not later.begun:
            decoding.hand_over()
        core, _, _ = later.result()  # DumpDecodeError if they do not decode
        self._cached, self._emptied = core._cached, core._emptied
        self._snapshots, self._budget = core._snapshots, core._budget
        self._decoding = None
        for op in decoding.after_handed:
            self._apply(op)
        return True

    def _apply(self, op: tuple[str, Any]) -> None:
        kind, argument = op
        if kind == "append":
            self._append(argument)
        else:
            self._set_budget(argument)

    def append(self, messages: Iterable[Message]) -> None:
        """Committed, numbered messages, in commit order."""
        decoding = self._decoding
        if decoding is not None:
            if decoding.decoding.begun and not decoding.decoding.done():
                decoding.ops.append(("append", tuple(messages)))
                return
            self._settle()
        self._append(messages)

    def _append(self, messages: Iterable[Message]) -> None:
        cached, snapshots, limit = self._cached, self._snapshots, self._max_messages
        budget = self._budget
        for message in messages:
            subject = message.subject
            queue = cached.get(subject)
            if queue is None:
                queue = cached[subject] = _Queue(subject, limit, self._emptied)
                if budget is not None and limit:
                    budget.bytes += QUEUE_OVERHEAD
            elif queue and queue[-1][PACKED_EPOCH] != message.epoch:
                if budget is not None:
                    budget.dropped(queue, packed_sizes(queue), len(queue))
                queue.clear()  # a new lineage: older messages are not its history (the
                # snapshot goes on: merge_snapshot alone makes it, as in the hub)
            packed = pack(message)
            if budget is not None and limit:
                if len(queue) == limit:  # the deque drops its oldest
                    budget.dropped(queue, packed_size(queue[0]))
                budget.added(queue, packed_size(packed))
            queue.append(packed)
            if message.retained:
                merged = merge_snapshot(snapshots.get(subject), message)
                if merged is not None:
                    snapshots[subject] = merged
        if budget is not None and budget.bytes > budget.limit:
            budget.evict()
            self._forget_emptied()

    def _forget_emptied(self) -> None:
        """Drop from the caches the queues the budget's eviction emptied."""
        cached = self._cached
        for queue in self._emptied:
            if not queue and cached.get(queue.subject) is queue:
                del cached[queue.subject]
        self._emptied.clear()

    def set_budget(self, budget_bytes: int) -> None:
        """Take this seed's ``CacheMemoryBudget`` (a dump carries the one of the seed that
        wrote it): the FIFO keeps its order, and the oldest go if the new one is smaller."""
        decoding = self._decoding
        if decoding is not None:
            if not decoding.decoding.done():  # (before the decoding begins: handed to it)
                decoding.ops.append(("budget", budget_bytes))
                return
            self._settle()
        self._set_budget(budget_bytes)

    def _set_budget(self, budget_bytes: int) -> None:
        current = self._budget
        if (current.limit if current else 0) == budget_bytes:
            return
        order = list(current.live_order()) if current is not None else None
        self._budget = self._rebuilt_budget(budget_bytes, order)

    def _rebuilt_budget(
        self, budget_bytes: int, order: Sequence[BudgetedQueue] | None,
        sizes: int | None = None,
    ) -> CacheBudget | None:
        """A budget over the cached messages: ``order`` (one entry per cached message,
        oldest first) or, without one, subject after subject; ``sizes``: their
        :func:`packed_size` summed, if known."""
        for queue in self._cached.values():
            queue.stale = queue.fifo_entries = 0
        if not budget_bytes:
            return None
        budget = CacheBudget(budget_bytes)
        if order is None or len(order) != sum(map(len, self._cached.values())):
            order = [q for q in self._cached.values() for _ in range(len(q))]  # subject-wise
        budget.extend(order)
        if sizes is None:
            sizes = self._sizes()
        queues = sum(1 for q in self._cached.values() if q)
        budget.bytes = sizes + budget.live * ENTRY_OVERHEAD + queues * QUEUE_OVERHEAD
        budget.evict()
        self._forget_emptied()
        return budget

    def _sizes(self) -> int:
        return sum(map(packed_sizes, self._cached.values()))

    def to_sync(self, clsn: int, positions: Mapping[str, tuple[int, int]]) -> CacheSync:
        """The caches as a cache sync after batch ``clsn``; ``positions`` maps each
        numbered subject to its ``(epoch, seq)`` (a subject whose messages are all
        evicted, ``max_messages = 0``, still has a position).

        Cheap: the caches are copied as they stand, packed (a tuple per subject), and the
        records -- their ``Message`` objects -- are built only when read
        (:class:`DumpRecords`). The Raft thread calls this when it loads a dump and goes
        on applying batches to these caches; building every cached message there was
        ~0.7 s of it for 660,000 messages, and the records of a million subjects ~2 s
        (docs/benchmarks.md): now the seed builds them in its install's slices. Loaded
        from a dump, the copies are made by the thread that decodes the dump's caches
        (begun here if it was not), and the records read them once they are made."""
        decoding = self._decoding
        if decoding is not None:
            self.begin_decoding()
            if not decoding.after_handed:  # its copies are the caches now
                return CacheSync(clsn, DumpRecords(positions, {}, {}, decoding.decoding))
            self._settle()
        return CacheSync(clsn, DumpRecords(positions, self._copies(), dict(self._snapshots)))

    def _copies(self) -> dict[str, tuple[PackedMessage, ...]]:
        # each copy untracked, as the queues are: packed messages only (a young collection
        # walked the 660,000 in the copies, 27 ms, once)
        return {s: untrack(tuple(q)) for s, q in self._cached.items()}

    # pickled into pysyncobj's dump: the "caches" (below) as one bytes, pickled and
    # compressed by the dump's writer, with their CRC-32: the Raft thread loading the dump
    # unpickles one object, and the caches decode in a thread of their own
    # (cluster/dump_decoder.py); a dump of the code before has the caches themselves
    # (loaded at once, as then). The caches: plain tuples, no deques (a dump written
    # before the cache was packed holds Message objects: they are packed on load); the
    # budget's FIFO as subject names, one per cached message (a dump written before the
    # budget has none); "sizes": the cached messages' sizes summed for a budget, by the
    # dump's writer (summed at the load, they were half of the budget's rebuild there:
    # 160 ms of 300 at 660,000 messages; a dump from before has none, and they are
    # summed then)
    def __getstate__(self) -> dict[str, Any]:
        packed, crc = encode(self.caches_state())
        return {"max_messages": self._max_messages, "packed": packed, "crc": crc,
                "snapshot_count": len(self._snapshots)}

    def caches_state(self) -> dict[str, Any]:
        """The caches as a dump of the code before held them (packed by :meth:`__getstate__`)."""
        self._settle()
        budget = self._budget
        return {
            "max_messages": self._max_messages,
            "cached": {s: tuple(q) for s, q in self._cached.items()},
            "snapshots": dict(self._snapshots),
            "budget": 0 if budget is None else budget.limit,
            "order": () if budget is None else tuple(
                q.subject for q in budget.live_order() if isinstance(q, _Queue)
            ),
            "sizes": self._sizes(),
        }

    def __setstate__(self, state: dict[str, Any]) -> None:
        self._decoding = None
        if "packed" not in state:  # a dump of the code before: its caches, loaded now
            self._load(state)
            return
        self._max_messages = limit = state["max_messages"]
        self._cached, self._emptied, self._snapshots, self._budget = {}, [], {}, None
        decoding = DumpDecoding(  # DumpDecodeError now for a damaged one
            state["packed"], state["crc"], functools.partial(_build, max_messages=limit)
        )
        self._decoding = _Decoding(decoding, state.get("snapshot_count", 0))

    def _load(self, state: dict[str, Any]) -> None:
        self._max_messages = limit = state["max_messages"]
        cached: dict[str, _Queue] = {}
        self._cached = cached
        emptied: list[_Queue] = []
        self._emptied = emptied
        for s, messages in state["cached"].items():
            if not messages:
                continue  # a queue comes with a subject's first cached message
            if isinstance(messages[0], Message):  # a dump from before packing: all are
                messages = map(pack, messages)
            cached[s] = _Queue(s, limit, emptied, messages)  # packed: taken in C
        self._snapshots = dict(state["snapshots"])
        names = state.get("order", ())
        order = [cached[n] for n in names if n in cached] if names else None
        self._budget = self._rebuilt_budget(state.get("budget", 0), order, state.get("sizes"))


_Decoded = tuple[ReplicatedCache, dict[str, tuple[PackedMessage, ...]], dict[str, Message]]


def _build(caches: dict[str, Any], ops: Sequence[tuple[str, Any]], *, max_messages: int
           ) -> _Decoded:
    """In the decoding thread: the caches of a dump, with ``ops`` applied, and the copies
    a cache sync of them reads (:meth:`ReplicatedCache.to_sync`)."""
    if not isinstance(caches, dict):
        raise TypeError(f"the caches are a {type(caches).__name__}, not a dict")
    core = ReplicatedCache.__new__(ReplicatedCache)
    core._decoding = None
    core._load({**caches, "max_messages": max_messages})
    for op in ops:
        core._apply(op)
    return core, core._copies(), dict(core._snapshots)
