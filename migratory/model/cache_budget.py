"""A memory budget over every subject's cache: past it, the oldest cached messages go
first, whichever subject holds them. Pure.

Without it the caches are bounded only per subject (``MaxCachedMessagesPerSubject``)
and, in the hub, by ``CacheExpireTime``; a Raft seed's replicated caches never expire
at all. A cached 100-byte message takes ~370 bytes of memory
(``benchmarks/cache_memory.py``), so 10,000 busy subjects of 1,000 messages each are
~3.7 GB per cache, and a seed holds two (its hub's and the Raft state's): a
market-data load would take a server past its container's memory limit (2 GiB in
deploy/k8s), and every seed at about the same moment. ``CacheMemoryBudget`` bounds
each cache; a subscriber that resumes from a message the budget dropped gets the
snapshot and ``DATA_RESYNC``, as for an expired one -- never a silent gap
(``last_seq_seen`` survives every drop).

It bounds cached messages (and, in the replicated cache, each subject's queue of them),
not subjects: a Guaranteed member's per-subject state is outside it.

How: every message a cache takes is appended to one FIFO of *queue keys* (a
reference to the subject's queue's key, 8 bytes; not the message), in the order the
messages came. A queue that drops messages itself -- its count cap, its expiry, a new
epoch -- always drops its oldest, so the FIFO's entries for them are that queue's
earliest ones: the queue counts them (``stale``) instead of the FIFO searching for them.
Over the budget, the FIFO is popped from the left: a stale entry is skipped (its queue's
count goes down), any other one is its queue's oldest message, which the queue drops.
When stale entries outnumber live ones the FIFO is rebuilt without them, so it holds at
most about twice the cached messages. Every step depends only on the order of the
appends: the replicated cache, fed in commit order, drops the same messages on every
seed.

The FIFO holds keys (ints), not the queues, and is untracked by the garbage collector
(:mod:`migratory.model.untracked`): a full collection visits every item of a tracked
container, and a FIFO of queues was ~2.5 visits per cached message on a seed (its two
caches' budgets), ~45 ms of a 155 ms collection (docs/benchmarks.md, issue 13). It could
not simply be untracked while it held the queues: a hub's caches refer to their budget,
so the cycle cache -> budget -> FIFO -> cache would have kept a dropped hub alive for
ever. The queues are held by key in a dict (one entry per queue that has entries in the
FIFO, not one per message), which the collector sees whole.
"""

from __future__ import annotations

import itertools
from collections import deque
from collections.abc import Iterable, Iterator
from typing import Protocol

from migratory.model.untracked import untrack

__all__ = ["ENTRY_OVERHEAD", "QUEUE_OVERHEAD", "BudgetedQueue", "CacheBudget"]

ENTRY_OVERHEAD = 270
"""Bytes counted per cached message beyond its own (content, subject, fields): its entry
tuple, the content's and the subject's object headers, its deque slot and FIFO entry.
Measured: 356-369 bytes of memory per cached 100-byte message with a subject of 18
characters (benchmarks/cache_memory.py, --budget 0), 387-396 under a budget."""
QUEUE_OVERHEAD = 760
"""Bytes counted for a subject's queue of cached messages while it exists (an empty
``collections.deque`` is 760 bytes): one-off subjects by the million are mostly queues."""
COMPACT_SLACK = 4096

_KEYS = itertools.count(1)
"""Queue keys, unique in the process (a queue keeps its key from one budget to the next)."""


class BudgetedQueue(Protocol):
    """One subject's cache, as the budget sees it."""

    stale: int
    """The budget's FIFO entries of messages this queue dropped itself (its oldest)."""
    fifo_key: int
    """Its key in the budget's FIFO (0: none given yet)."""
    fifo_entries: int
    """The budget's FIFO entries for it, live and stale (0 to start with)."""

    def drop_oldest(self) -> int:
        """Drop the oldest cached message (the budget's choice); its size, as counted
        when it was added, plus :data:`QUEUE_OVERHEAD` if the queue goes with it (0 if
        the queue is empty)."""
        ...


class CacheBudget:
    """``limit`` bytes (sizes plus :data:`ENTRY_OVERHEAD` each) over many queues."""

    __slots__ = ("bytes", "evicted", "limit", "live", "order", "queues")

    def __init__(self, limit: int) -> None:
        if limit <= 0:
            raise ValueError(f"a cache budget is a positive number of bytes, got {limit}")
        self.limit = limit
        self.bytes = 0
        self.live = 0  # messages cached under this budget
        self.evicted = 0  # messages dropped by the budget, in all
        self.order: deque[int] = untrack(deque())
        """The FIFO: a queue's key per message it took, oldest first (ints only)."""
        self.queues: dict[int, BudgetedQueue] = {}
        """Each queue with entries in the FIFO, by key."""

    def __repr__(self) -> str:
        return (f"<CacheBudget {self.bytes}/{self.limit} bytes, {self.live} messages, "
                f"{len(self.order) - self.live} stale entries>")

    def added(self, queue: BudgetedQueue, size: int) -> None:
        """``queue`` took a message of ``size`` bytes (its newest)."""
        entries = queue.fifo_entries
        if entries:
            self.order.append(queue.fifo_key)
        else:
            key = queue.fifo_key or next(_KEYS)
            queue.fifo_key = key
            self.queues[key] = queue
            self.order.append(key)
        queue.fifo_entries = entries + 1
        self.bytes += size + ENTRY_OVERHEAD
        self.live += 1

    def extend(self, queues: Iterable[BudgetedQueue]) -> None:
        """Entries for messages ``queues`` already hold, oldest first, one per message
        (the caller counts their bytes); for a budget made over full caches."""
        for queue in queues:
            if not queue.fifo_entries:
                if not queue.fifo_key:
                    queue.fifo_key = next(_KEYS)
                self.queues[queue.fifo_key] = queue
            queue.fifo_entries += 1
            self.order.append(queue.fifo_key)
            self.live += 1

    def dropped(self, queue: BudgetedQueue, size: int, count: int = 1) -> None:
        """``queue`` dropped its ``count`` oldest messages, of ``size`` bytes together
        (its own :data:`QUEUE_OVERHEAD` included if it let its queue go)."""
        self.bytes -= size + count * ENTRY_OVERHEAD
        if count <= 0:
            return
        queue.stale += count
        self.live -= count
        if len(self.order) > 2 * self.live + COMPACT_SLACK:
            self.compact()

    @property
    def over(self) -> bool:
        return self.bytes > self.limit

    def evict(self) -> int:
        """Drop the oldest messages until within the limit; how many were dropped. (A
        queue leaves :attr:`queues` with its last FIFO entry.)"""
        order, queues, evicted = self.order, self.queues, 0
        while self.bytes > self.limit and order:
            key = order.popleft()
            queue = queues[key]
            queue.fifo_entries -= 1
            if not queue.fifo_entries:
                del queues[key]
            if queue.stale:
                queue.stale -= 1
                continue
            self.bytes -= queue.drop_oldest() + ENTRY_OVERHEAD
            self.live -= 1
            evicted += 1
        self.evicted += evicted
        return evicted

    def compact(self) -> None:
        """Rebuild the FIFO without its stale entries (every queue's stale back to 0)."""
        kept: deque[int] = untrack(deque())
        append, queues = kept.append, self.queues
        for key in self.order:
            queue = queues[key]
            if queue.stale:
                queue.stale -= 1
                queue.fifo_entries -= 1
                if not queue.fifo_entries:
                    del queues[key]
            else:
                append(key)
        self.order = kept

    def live_order(self) -> Iterator[BudgetedQueue]:
        """The FIFO's live entries, oldest first, changing nothing (for a dump, which may
        be taken in a forked child)."""
        skipped: dict[int, int] = {}
        queues = self.queues
        for key in self.order:
            queue = queues[key]
            done = skipped.get(key, 0)
            if done < queue.stale:
                skipped[key] = done + 1
            else:
                yield queue
