"""The caches in the seeds' replicated state: what a Raft dump carries."""

from __future__ import annotations

import gc
import pickle
import tracemalloc

import pytest
from memory_held import held_by

from cluster.replicated_cache import ReplicatedCache
from migratory.model.message import FIELD_TEXT_MEMORY, Message, MessageType, Qos


def message(subject: str, seq: int, epoch: int = 3, retained: bool = True) -> Message:
    return Message(subject, b"c%d" % seq, {"n": str(seq)}, retained, Qos.GUARANTEED, None,
                   epoch, seq, MessageType.UPDATE)


def test_keeps_the_last_messages_and_the_merged_snapshot_per_subject() -> None:
    cache = ReplicatedCache(max_messages=2)
    cache.append([message("/a/b", s) for s in (1, 2, 3)] + [message("/c/d", 1, retained=False)])
    sync = cache.to_sync(9, {"/a/b": (3, 3), "/c/d": (3, 1)})
    assert sync.clsn == 9
    by_subject = {s.subject: s for s in sync.subjects}
    assert by_subject["/a/b"].cached == (message("/a/b", 2), message("/a/b", 3))
    assert by_subject["/a/b"].snapshot is not None and by_subject["/a/b"].snapshot.seq == 3
    assert by_subject["/c/d"].cached == (message("/c/d", 1, retained=False),)
    assert by_subject["/c/d"].snapshot is None


def test_a_new_epoch_drops_the_older_lineage() -> None:
    cache = ReplicatedCache()
    cache.append([message("/a/b", 1, epoch=3), message("/a/b", 1, epoch=4)])
    (subject,) = cache.to_sync(2, {"/a/b": (4, 1)}).subjects
    assert subject.cached == (message("/a/b", 1, epoch=4),)


def test_a_position_of_another_epoch_gets_no_messages_and_the_subjects_snapshot() -> None:
    """Messages of another lineage are not its history; the snapshot is the subject's,
    whatever its epoch (one rule with the hub: tests/cluster/test_snapshot_one_rule.py;
    it was left out before)."""
    cache = ReplicatedCache()
    cache.append([message("/a/b", 1, epoch=3)])
    (subject,) = cache.to_sync(1, {"/a/b": (8, 4)}).subjects
    assert subject.cached == () and subject.snapshot is not None
    assert (subject.snapshot.epoch, subject.snapshot.seq) == (3, 1)


def test_pickle_round_trip_and_a_dump_from_before_packing() -> None:
    cache = ReplicatedCache(max_messages=5)
    cache.append([message("/a/b", s) for s in (1, 2)])
    positions = {"/a/b": (3, 2)}
    restored = pickle.loads(pickle.dumps(cache))
    assert restored.to_sync(2, positions) == cache.to_sync(2, positions)
    old_state = {  # what an older member's dump holds: Message objects
        "max_messages": 5,
        "cached": {"/a/b": (message("/a/b", 1), message("/a/b", 2))},
        "snapshots": cache.caches_state()["snapshots"],
    }
    old = ReplicatedCache.__new__(ReplicatedCache)
    old.__setstate__(old_state)
    assert old.to_sync(2, positions) == cache.to_sync(2, positions)


def test_cached_messages_are_not_tracked_by_the_collector() -> None:
    """50,000 tracked messages made a seed's full collections stop it ~180 ms (issue 8)."""
    cache = ReplicatedCache(max_messages=1000)
    gc.collect()
    before = sum(isinstance(o, Message) for o in gc.get_objects())
    cache.append([message(f"/s/{i % 10}", i // 10 + 1, retained=False) for i in range(5000)])
    gc.collect()
    assert sum(isinstance(o, Message) for o in gc.get_objects()) == before


def cached(cache: ReplicatedCache, positions: dict[str, tuple[int, int]]) -> dict[str, list[int]]:
    return {s.subject: [m.seq for m in s.cached] for s in cache.to_sync(1, positions).subjects}


def commits(start: int, count: int) -> list[list[Message]]:
    """Batches over three subjects of uneven traffic, a new epoch on /c/d midway."""
    batches = []
    for i in range(start, start + count):
        subject = ("/a/b", "/a/b", "/b/c", "/c/d")[i % 4]
        seq = i // 4 * 2 + i % 4 + 1 if i % 4 < 2 else i // 4 + 1
        epoch = 3
        if subject == "/c/d" and i >= 40:  # /c/d restarts at seq 1 in epoch 4 from i = 43
            epoch, seq = 4, (i - 43) // 4 + 1
        batches.append([message(subject, seq, epoch=epoch)])
    return batches


def positions(count: int) -> dict[str, tuple[int, int]]:
    """Every subject's position after ``commits(0, count)``."""
    return {b[0].subject: (b[0].epoch, b[0].seq) for b in commits(0, count)}


POSITIONS = {"/a/b": (3, 36), "/b/c": (3, 17), "/c/d": (4, 7)}
assert positions(70) == POSITIONS


def test_the_budget_drops_the_same_messages_on_every_seed_and_after_a_dump() -> None:
    from migratory.model.cache_budget import ENTRY_OVERHEAD, QUEUE_OVERHEAD

    budget = 9 * (ENTRY_OVERHEAD + 12) + 3 * QUEUE_OVERHEAD  # 9 messages over 3 subjects
    steady, restored = ReplicatedCache(5, budget), ReplicatedCache(5, budget)
    for batch in commits(0, 30):
        steady.append(batch)
        restored.append(batch)
    restored = pickle.loads(pickle.dumps(restored))  # a dump taken, and loaded
    for done, batch in enumerate(commits(30, 40), start=31):
        steady.append(batch)
        restored.append(batch)
        assert cached(steady, positions(done)) == cached(restored, positions(done))
    kept = cached(steady, POSITIONS)
    assert sum(map(len, kept.values())) < 15  # the budget, not the count cap (5 each)
    assert steady.budget is not None and steady.budget.bytes <= budget
    # the newest messages of all are the ones kept
    assert kept["/a/b"] == list(range(36 - len(kept["/a/b"]) + 1, 37))


def test_a_dump_from_before_the_budget_takes_this_seeds_budget() -> None:
    from migratory.model.cache_budget import ENTRY_OVERHEAD, QUEUE_OVERHEAD

    old = ReplicatedCache(5)
    for batch in commits(0, 70):
        old.append(batch)
    state = old.caches_state()
    del state["budget"], state["order"]  # as a dump written before the budget
    loaded = ReplicatedCache.__new__(ReplicatedCache)
    loaded.__setstate__(state)
    assert cached(loaded, POSITIONS) == cached(old, POSITIONS)  # nothing dropped yet
    limit = 4 * (ENTRY_OVERHEAD + 12) + 3 * QUEUE_OVERHEAD
    loaded.set_budget(limit)  # no order in the dump: subject after subject
    assert loaded.budget is not None and loaded.budget.bytes <= limit
    assert 4 <= sum(map(len, cached(loaded, POSITIONS).values())) < 15
    loaded.set_budget(0)
    assert loaded.budget is None


def test_a_subject_the_budget_emptied_leaves_no_queue_behind() -> None:
    from migratory.model.cache_budget import ENTRY_OVERHEAD, QUEUE_OVERHEAD

    # each message: 12 bytes of text, its field's name and value objects, its entry
    cache = ReplicatedCache(5, 3 * (ENTRY_OVERHEAD + 12 + 2 * FIELD_TEXT_MEMORY + QUEUE_OVERHEAD))
    for i in range(1000):  # one-off subjects: each queue emptied by the budget later
        cache.append([message(f"/one/{i:03d}", 1)])
    assert len(cache._cached) == 3  # not 1,000 empty deques (~760 bytes each)
    (kept,) = cache.to_sync(1, {"/one/999": (3, 1)}).subjects
    assert [m.seq for m in kept.cached] == [1]
    (gone,) = cache.to_sync(1, {"/one/000": (3, 1)}).subjects
    assert gone.cached == () and gone.snapshot is not None  # positions, snapshots stay
    cache.append([message("/one/000", 2)])  # the subject goes on in a queue of its own
    assert [m.seq for m in cache.to_sync(1, {"/one/000": (3, 2)}).subjects[0].cached] == [2]


def test_a_full_collection_walks_no_cached_message() -> None:
    """The queues of packed messages are not tracked (issue 13: walking a seed's ~550,000
    of them was ~half of a full collection), and hold nothing tracked that could lead
    back to them: a dropped cache is freed by reference counting, emptied queues too."""
    cache = ReplicatedCache(max_messages=1000, budget_bytes=20_000)
    cache.append([message(f"/s/{i % 10}", i // 10 + 1, retained=False) for i in range(5000)])
    gc.collect()
    queues = list(cache._cached.values())
    assert queues
    assert not [q for q in queues if gc.is_tracked(q)]
    assert sum(len(gc.get_referents(q)) for q in queues if gc.is_tracked(q)) == 0
    for queue in queues:  # their references: their class, the (empty) list of emptied
        held = [r for r in gc.get_referents(queue) if not isinstance(r, type)]  # queues, atoms
        assert all(r == [] or not gc.is_tracked(r) for r in held)
    def churn(caches: int) -> None:  # the budget empties queues, and each cache is dropped
        for _ in range(caches):
            dropped = ReplicatedCache(max_messages=1000, budget_bytes=20_000)
            for n in range(40):
                dropped.append([message(f"/t/{n}/{i}", 1, retained=False) for i in range(50)])
            del dropped

    churn(2)  # what first use allocates for good
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        churn(20)
        gc.collect()
        grown = tracemalloc.get_traced_memory()[0] - before
    finally:
        tracemalloc.stop()
    assert grown < 20_000  # one cache alone is ~80 kB: none is left behind


def test_a_dump_s_budget_is_summed_without_a_call_per_message(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A seed loading a Raft dump sums every cached message's size for the budget, on its
    Raft thread (660,000 with the default CacheMemoryBudget): a Python call each was
    ~22 % of that thread's load (py-spy). Counted: packed_size calls while 500 messages
    are loaded (500 before), and the same bytes as the seed that wrote the dump."""
    from cluster import replicated_cache

    written = ReplicatedCache(max_messages=1000, budget_bytes=10**9)
    written.append([message(f"/s/{i % 5}", i // 5 + 1) for i in range(500)])
    written.append([Message("/f/a", b"x", {"k": "v" * i}, epoch=3, seq=i) for i in (1, 2)])
    dump = pickle.dumps(written)
    calls: list[object] = []
    size_of = replicated_cache.packed_size

    def counted(packed: object) -> int:
        calls.append(packed)
        return size_of(packed)  # type: ignore[arg-type]

    monkeypatch.setattr(replicated_cache, "packed_size", counted)
    loaded = pickle.loads(dump)
    assert calls == []
    assert loaded.budget.bytes == written.budget.bytes and loaded.budget.live == 502


def test_a_dump_carries_its_sizes_so_a_load_sums_none(monkeypatch: pytest.MonkeyPatch) -> None:
    """Summing every cached message's size for the budget was half of the budget's
    rebuild on the Raft thread loading a dump (160 ms of 300 at 660,000 messages): the
    dump's writer sums them (in its forked child). Counted: ``packed_sizes`` calls while
    a dump of 7 subjects loads -- one per subject before, none now -- and the same bytes;
    a dump from before (no sizes) is summed, to the same bytes."""
    from cluster import replicated_cache

    written = ReplicatedCache(max_messages=1000, budget_bytes=10**9)
    written.append([message(f"/s/{i % 5}", i // 5 + 1) for i in range(500)])
    written.append([Message("/f/a", b"x", {"k": "v" * i}, epoch=3, seq=i) for i in (1, 2)])
    written.append([Message("/g/a", b"y" * 300, epoch=3, seq=1)])
    dump = pickle.dumps(written)
    old_state = written.caches_state()
    old_state.pop("sizes", None)
    calls: list[object] = []
    sizes_of = replicated_cache.packed_sizes

    def counted(packed: object) -> int:
        calls.append(packed)
        return sizes_of(packed)  # type: ignore[arg-type]

    monkeypatch.setattr(replicated_cache, "packed_sizes", counted)
    loaded = pickle.loads(dump)
    assert calls == []
    assert loaded.budget.bytes == written.budget.bytes
    old = ReplicatedCache.__new__(ReplicatedCache)
    old.__setstate__(old_state)
    assert len(calls) == 7 and old.budget.bytes == written.budget.bytes


def test_a_budget_bounds_the_memory_of_messages_of_many_tiny_fields() -> None:
    """Each field name and value a packed message holds is a str object (~56 bytes) in a
    slot of the tuple (8); packed_size counted its length alone. Messages of 1,000 fields
    of 4-character names: a 1 MB budget kept 16 MB of them (tracemalloc)."""
    limit = 1_000_000

    def fill() -> ReplicatedCache:
        cache = ReplicatedCache(max_messages=1000, budget_bytes=limit)
        for seq in range(1, 61):
            cache.append([
                Message(f"/f/{n}", b"", {f"{seq % 16:x}{i:03x}": "" for i in range(1000)},
                        epoch=3, seq=seq)
                for n in range(4)
            ])
        return cache

    assert held_by(fill) < limit * 1.25
