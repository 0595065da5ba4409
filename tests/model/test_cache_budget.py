"""The memory budget over many subjects' caches (migratory/model/cache_budget.py), driven
by hypothesis through SubjectCache: appends, count caps, expiry, new epochs, caches
thrown away -- and the budget always drops the oldest message of all first."""

from __future__ import annotations

import gc
from dataclasses import dataclass, field

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from memory_held import held_by

from migratory.model.cache import SubjectCache, encoded_bound
from migratory.model.cache_budget import ENTRY_OVERHEAD, QUEUE_OVERHEAD, CacheBudget
from migratory.model.message import FIELD_TEXT_MEMORY, Message


@dataclass
class World:
    """Caches sharing one budget, and what the test knows of every message."""

    budget: CacheBudget
    caches: dict[int, SubjectCache] = field(default_factory=dict)
    epochs: dict[int, int] = field(default_factory=dict)
    thrown_away: list[SubjectCache] = field(default_factory=list)
    appended_at: dict[tuple[int, int, int], int] = field(default_factory=dict)
    appends: int = 0

    def kept(self) -> dict[tuple[int, int, int], int]:
        """(subject, epoch, seq) -> append index of every message still cached."""
        return {
            (s, m.epoch, m.seq): self.appended_at[(s, m.epoch, m.seq)]
            for s, cache in self.caches.items() for m in cache.last(len(cache))
        }

    def check(self) -> None:
        budget, live = self.budget, list(self.caches.values())
        assert budget.live == sum(len(c) for c in live)
        assert budget.bytes == sum(
            c.memory_bytes + len(c) * ENTRY_OVERHEAD + (0 if c._entries is None else QUEUE_OVERHEAD)
            for c in live)
        every = live + self.thrown_away
        assert len(budget.order) == budget.live + sum(c.stale for c in every)
        assert len(budget.order) <= 2 * budget.live + 4096 + 1
        holding = {c.fifo_key: c for c in every if c.fifo_entries}  # the FIFO's queues, by key
        assert budget.queues == holding
        assert sum(c.fifo_entries for c in holding.values()) == len(budget.order)


operations = st.lists(
    st.one_of(
        st.tuples(st.just("append"), st.integers(0, 3), st.integers(0, 300)),
        st.tuples(st.just("append"), st.integers(0, 3), st.integers(0, 300)),
        st.tuples(st.just("expire"), st.integers(0, 3), st.integers(0, 30)),
        st.tuples(st.just("new epoch"), st.integers(0, 3), st.just(0)),
        st.tuples(st.just("throw away"), st.integers(0, 3), st.just(0)),
    ),
    max_size=300,
)


@settings(max_examples=300, deadline=None)
@given(limit=st.integers(1, 3000) | st.integers(3000, 20_000), max_messages=st.integers(0, 8),
       ops=operations)
def test_the_budget_counts_every_cache_and_drops_the_oldest_of_all_first(
    limit: int, max_messages: int, ops: list[tuple[str, int, int]]
) -> None:
    world = World(CacheBudget(limit))
    now = 0.0
    for kind, subject, value in ops:
        now += 1.0
        cache = world.caches.get(subject)
        if cache is None:
            cache = world.caches[subject] = SubjectCache(
                max_messages=max_messages, expire_seconds=10.0, budget=world.budget)
            world.epochs.setdefault(subject, 1)
        if kind == "append":
            epoch, seq = world.epochs[subject], cache.last_seq_seen + 1
            message = Message(f"/s/{subject}", b"x" * value, {"k": "v"} if value % 2 else {},
                              epoch=epoch, seq=seq)
            world.appended_at[(subject, epoch, seq)] = world.appends
            world.appends += 1
            cache.append(message, now)
            before = world.kept()
            if world.budget.over:
                evicted_count = world.budget.evict()
                after = world.kept()
                evicted = set(before) - set(after)
                assert len(evicted) >= evicted_count
                if evicted_count and after:  # everything the budget dropped was older
                    newest_dropped = max(before[k] for k in evicted)
                    assert newest_dropped < min(after.values())
                assert not world.budget.over or not after
            charge = encoded_bound(message) + 2 * FIELD_TEXT_MEMORY * len(message.fields)
            assert charge + ENTRY_OVERHEAD > limit or max_messages == 0 \
                or (subject, epoch, seq) in world.kept()  # the newest is always kept
        elif kind == "expire":
            cache.expire(now + value)
        elif kind == "new epoch":
            cache.reset()
            world.epochs[subject] += 1
        else:
            cache.release()
            world.thrown_away.append(world.caches.pop(subject))
        world.check()


def test_a_budget_needs_a_positive_limit() -> None:
    with pytest.raises(ValueError, match="positive"):
        CacheBudget(0)


def test_a_cache_emptied_by_the_budget_still_tells_a_gap_from_up_to_date() -> None:
    budget = CacheBudget(3 * (ENTRY_OVERHEAD + 12) + QUEUE_OVERHEAD)
    cold = SubjectCache(budget=budget)
    hot = SubjectCache(budget=budget)
    cold.append(Message("/cold/a", b"1234567", epoch=1, seq=1), 0.0)
    for seq in range(1, 4):
        hot.append(Message("/hot/a", b"123456", epoch=1, seq=seq), 0.0)
        budget.evict()
    assert len(cold) == 0 and cold.last_seq_seen == 1  # the oldest of all went first
    assert cold.since(0) is None  # a resume from before it: DATA_RESYNC, not silence
    assert cold.since(1) == []
    assert [m.seq for m in hot.last(3)] == [1, 2, 3]


@pytest.mark.parametrize("max_messages", [1, 2, 3])
def test_every_way_a_cache_drops_messages_is_counted(max_messages: int) -> None:
    budget = CacheBudget(10**9)
    cache = SubjectCache(max_messages=max_messages, expire_seconds=10.0, budget=budget)

    def counted() -> tuple[int, int]:
        queue = 0 if cache._entries is None else QUEUE_OVERHEAD
        return budget.live, budget.bytes - len(cache) * ENTRY_OVERHEAD - queue

    for seq in range(1, 6):  # past the count cap
        cache.append(Message("/a/b", b"x" * seq, epoch=1, seq=seq), float(seq))
        assert counted() == (len(cache), cache.bytes)
    held = len(cache)
    assert cache.expire(5.0 + 10.0 - 0.5) == held - 1  # all but the newest
    assert counted() == (1, cache.bytes)
    cache.reset()  # a new epoch
    assert counted() == (0, 0)
    cache.append(Message("/a/b", b"y", epoch=2, seq=1), 20.0)
    cache.release()  # thrown away
    assert counted() == (0, 0) and budget.bytes == 0
    assert len(budget.order) == sum((budget.live, cache.stale))


def budgets_alive() -> int:
    gc.collect()
    return sum(isinstance(o, CacheBudget) for o in gc.get_objects())


def test_a_full_collection_visits_no_budget_entry_per_cached_message() -> None:
    """The FIFO holds the queues' keys and is untracked (issue 13: on a seed its two
    budgets' FIFOs were ~2.5 items visited per cached message, ~45 ms of a full
    collection); the collector sees the queues once each, in ``queues``. Before, the
    budget's tracked objects led to 5,000 items, one per cached message; and a hub's
    caches thrown away, with their budget, are still freed by the collector (the cycle
    cache -> budget -> queues -> cache is one it sees whole)."""
    before = budgets_alive()
    budget = CacheBudget(10**9)
    caches = [SubjectCache(budget=budget) for _ in range(10)]
    for i in range(5000):
        caches[i % 10].append(Message(f"/s/{i % 10}", b"x", epoch=1, seq=i // 10 + 1), 0.0)
    gc.collect()
    assert budget.live == 5000
    tracked = [r for r in gc.get_referents(budget) if gc.is_tracked(r) and not isinstance(r, type)]
    visited = sum(len(gc.get_referents(r)) for r in tracked)
    assert visited <= 2 * len(caches)  # each queue (a dict entry: key, queue): was 5,000
    assert not gc.is_tracked(budget.order)
    assert all(not gc.is_tracked(key) for key in budget.order)  # ints: no cycle through it
    assert budgets_alive() == before + 1
    del budget, caches, tracked  # the caches refer to their budget, which refers to them
    assert budgets_alive() == before


def tiny_fields(count: int, salt: int) -> dict[str, str]:
    """``count`` fields of 4-character names, made afresh as a decoder makes them."""
    return {f"{salt % 16:x}{i:03x}": "" for i in range(count)}


def test_a_budget_bounds_the_memory_of_messages_of_many_tiny_fields() -> None:
    """A message of 1,000 fields of 4-character names is 4 KB by MaxMessageSize's count
    and ~10 KB by its encoded bound, but each name is a str object of its own (~56
    bytes) in a slot of the entry (8): ~70 KB held. The budget counted the encoded
    bound: a 1 MB budget kept 6.7 MB of them (tracemalloc)."""
    limit = 1_000_000

    def fill() -> tuple[CacheBudget, list[SubjectCache]]:
        budget = CacheBudget(limit)
        caches = [SubjectCache(max_messages=1000, budget=budget) for _ in range(4)]
        for seq in range(1, 61):
            for n, cache in enumerate(caches):
                cache.append(Message(f"/f/{n}", b"", tiny_fields(1000, seq), epoch=1,
                                     seq=seq), 0.0)
                budget.evict()
        return budget, caches

    assert held_by(fill) < limit * 1.25
