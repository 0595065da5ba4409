"""A Raft dump's numbering is decoded off the Raft thread (cluster/raft_consumer.py).

Counted, not timed: the subjects the Raft thread puts into the numbering while it loads
a dump (every one before: ~2 s of it at a million subjects; none now), the Raft ticks a
restarted seed makes while its numbering is still decoding (it keeps ticking), and what
must not change: the batches committed meanwhile are numbered as a load at once numbers
them, in order, each handed over before any submitter's answer that came after it, and
a dump written meanwhile carries them.
"""

from __future__ import annotations

import pickle
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from test_dump_decoder import in_a_forked_writer, wait_until
from test_raft_dump_load import batch
from test_raft_dump_protocol import seed_state
from test_raft_dump_restart import free_port, wait_for

from cluster import dump_decoder, raft_unpickler
from cluster import raft as raft_module
from cluster.cache_sync import CacheSync
from cluster.coordination import CommittedBatch
from cluster.raft import CoordinationConsumer, RaftCoordination, RaftTimings

NUMBERING = "numbered subjects"


@pytest.fixture
def held_numbering(monkeypatch: pytest.MonkeyPatch) -> Iterator[threading.Event]:
    """A dump's numbering decodes once the event is set (set at the end of the test)."""
    gate = threading.Event()
    decode = dump_decoder.decode

    def held(packed: bytes, what: str = "cached messages") -> Any:
        if what == NUMBERING and threading.current_thread().name == "raft-dump-decoder":
            assert gate.wait(30)
        return decode(packed, what)

    monkeypatch.setattr(dump_decoder, "decode", held)
    yield gate
    gate.set()


def dumped(consumer: CoordinationConsumer) -> Any:
    """The consumer's state as a loaded dump hands it over (pickled by its writer)."""
    return raft_unpickler.loads(pickle.dumps(consumer._serialize(), 4))


def loaded(state: Any, events: list[Any]) -> CoordinationConsumer:
    consumer = CoordinationConsumer(lambda b: events.append(("commit", b.clsn)), events.append,
                                    cache_budget=10**8)  # (seed_state's)
    consumer._deserialize(state)  # (what pysyncobj's Raft thread calls)
    return consumer


def wire(n: int) -> list[Any]:
    return [("o#2", 10_000 + 3 * n + i, f"/s/{(n + i) % 9}", b"w%d" % n, {}, i == 0, True)
            for i in range(3)]


def test_the_raft_thread_puts_no_subject_of_a_dump_in_the_numbering(
    held_numbering: threading.Event,
) -> None:
    leader = seed_state(300)
    events: list[Any] = []
    follower = loaded(dumped(leader), events)
    coordinator = follower.coordinator
    assert coordinator.seqs == {}  # before: the 7 subjects, unpickled on this thread
    assert coordinator.subject_count == 7 and coordinator.clsn == leader.coordinator.clsn
    (sync,) = events
    assert isinstance(sync, CacheSync) and not sync.subjects.ready()  # type: ignore[attr-defined]
    held_numbering.set()
    wait_until(sync.subjects.ready, "the numbering decoded")  # type: ignore[attr-defined]
    assert sync == leader.cache.to_sync(leader.coordinator.clsn, leader.coordinator.positions())
    assert follower.catch_up() is False and not coordinator.decoding
    assert coordinator.digest() == leader.coordinator.digest()


def test_batches_committed_while_the_numbering_decodes_are_held_in_order(
    held_numbering: threading.Event,
) -> None:
    leader = seed_state(300)
    events: list[Any] = []
    follower = loaded(dumped(leader), events)
    events.clear()
    clsns = [follower.commit_batch(11, wire(n), _doApply=True) for n in range(4)]
    follower.in_order(lambda: events.append("barrier answered"))
    assert clsns == [7, 8, 9, 10] and events == []  # held: numbered once decoded
    assert follower.catch_up() is False  # (nothing before the numbering is here)
    # a dump written meanwhile (in a forked writer, as pysyncobj's) carries them
    writer = loaded(raft_unpickler.loads(in_a_forked_writer(follower._serialize())), [])
    held_numbering.set()
    wait_until(lambda: follower.coordinator.settle(wait=False), "the numbering decoded")
    assert follower.catch_up(until=0.0) is True  # one batch a slice, at least
    assert events == [("commit", 7)]
    assert follower.catch_up() is False
    # each batch handed over before the answer that came after it (a barrier's)
    assert events == [("commit", 7), ("commit", 8), ("commit", 9), ("commit", 10),
                      "barrier answered"]
    for n in range(4):
        leader.commit_batch(11, wire(n), _doApply=True)
    wait_until(lambda: writer.coordinator.settle(wait=False), "the writer's numbering")
    assert writer.catch_up() is False
    for state in (follower, writer):
        assert state.coordinator.digest() == leader.coordinator.digest()
        assert state.cache.caches_state() == leader.cache.caches_state()


def test_a_dump_loaded_over_held_batches_drops_them_and_gives_their_answers(
    held_numbering: threading.Event,
) -> None:
    events: list[Any] = []
    follower = loaded(dumped(seed_state(300)), events)
    follower.commit_batch(11, wire(0), _doApply=True)
    follower.in_order(lambda: events.append("answered"))
    later = seed_state(350)  # the leader's next dump: the batch held is in it
    events.clear()
    follower._deserialize(dumped(later))
    assert events[-1] == "answered" and not follower.held
    held_numbering.set()
    wait_until(lambda: follower.coordinator.settle(wait=False), "the numbering decoded")
    assert follower.coordinator.digest() == later.coordinator.digest()


def test_a_restarted_seed_ticks_while_its_numbering_decodes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A real seed (its Raft thread, its files): 40 batches, a compaction, 10 more, a
    stop; started again with its dump's numbering held back, its Raft thread goes on
    ticking, numbers nothing it holds until the numbering is here, then all of it."""
    port = free_port()

    def seed(committed: list[CommittedBatch], restored: list[CacheSync]) -> RaftCoordination:
        return RaftCoordination(
            self_address=("127.0.0.1", port), seed_addresses=[("127.0.0.1", port)],
            password="x", on_commit=committed.append, on_restore=restored.append,
            data_dir=tmp_path, timings=RaftTimings(compaction_entries=100_000,
                                                   compaction_seconds=3600),
        )

    def commit(raft: RaftCoordination, first: int, count: int) -> None:
        done = threading.Semaphore(0)
        for n in range(first, first + count):
            raft.consumer.commit_batch(7, batch(n), callback=lambda *_: done.release())
        for _ in range(count):
            assert done.acquire(timeout=20), "Raft did not commit"

    raft = seed([], [])
    try:
        wait_for(lambda: raft.snapshot.ready)
        commit(raft, 0, 40)
        raft.syncobj.forceLogCompaction()
        wait_for(lambda: (tmp_path / "raft.dump").exists())
        commit(raft, 40, 10)
        subjects = raft.snapshot.subjects
    finally:
        raft.close()
    gate = threading.Event()
    decode = dump_decoder.decode

    def held(packed: bytes, what: str = "cached messages") -> Any:
        if what == NUMBERING and threading.current_thread().name == "raft-dump-decoder":
            assert gate.wait(30)
        return decode(packed, what)

    monkeypatch.setattr(dump_decoder, "decode", held)
    ticks: list[bool] = []
    on_tick = raft_module._SeedSyncObj._onTick

    def ticked(node: Any, time_to_wait: float = 0.0) -> None:
        ticks.append(node._status_consumer.coordinator.decoding)
        on_tick(node, time_to_wait)

    monkeypatch.setattr(raft_module._SeedSyncObj, "_onTick", ticked)
    again: list[CommittedBatch] = []
    raft = seed(again, [])
    try:
        wait_for(lambda: ticks.count(True) >= 20)  # it ticks, its numbering held back
        assert len(raft.consumer.coordinator.seqs) == 0  # before: every subject, loaded
        assert raft.snapshot.subjects == subjects and again == []  # the 10 held
        assert len(raft.consumer.held) == 10
        # Raft counts them applied: its own last_applied says nothing of the hub's lag;
        # the status says they are held, and since when (the seed's readiness)
        wait_for(lambda: raft.snapshot.held == 10 and raft.snapshot.last_applied > 0)
        status = raft.snapshot
        assert status.last_applied == status.commit_index and status.held_since is not None
        gate.set()
        wait_for(lambda: raft.snapshot.clsn >= 50 and raft.snapshot.ready)
        wait_for(lambda: raft.snapshot.held == 0)
        assert raft.snapshot.held_since is None
        assert [b.clsn for b in again] == list(range(41, 51))
        assert raft.snapshot.subjects == subjects
    finally:
        gate.set()
        raft.close()
