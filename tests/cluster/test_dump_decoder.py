"""A Raft dump's cached messages are decoded off the Raft thread (cluster/dump_decoder.py).

Counted, not timed: the cached messages the Raft thread puts into the caches while it
loads a dump (every one before, none now), the dump's unpicklings at a seed's start-up
(two before, one now); and what must not change: the caches after batches applied while
the dump decodes are those of a load done at once, a dump written meanwhile (a forked
writer, as pysyncobj's) is whole, a damaged dump is refused and one that does not decode
stops the seed naming its file, and a follower that took long to load the leader's dump
does not stand for election at its next tick.
"""

from __future__ import annotations

import logging
import os
import pickle
import select
import threading
import time
import zlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pysyncobj.syncobj
import pytest
from pysyncobj.syncobj import _RAFT_STATE
from test_raft_dump_protocol import follower_seed, seed_state, written_dump
from test_raft_follower import LEADER, dump_message
from test_replicated_cache import POSITIONS, commits

import cluster.raft_follower
from cluster import dump_decoder, replicated_cache
from cluster.cache_sync import CacheSync
from cluster.raft import CoordinationConsumer
from cluster.replicated_cache import ReplicatedCache


@pytest.fixture
def queues_built(monkeypatch: pytest.MonkeyPatch) -> dict[str, int]:
    """Cached messages put into the caches' queues, by the name of the thread."""
    built: dict[str, int] = {}
    init = replicated_cache._Queue.__init__

    def counted(queue: Any, *args: Any, **kwargs: Any) -> None:
        init(queue, *args, **kwargs)
        name = threading.current_thread().name
        built[name] = built.get(name, 0) + len(queue)

    monkeypatch.setattr(replicated_cache._Queue, "__init__", counted)
    return built


def wait_until(predicate: Any, what: str, timeout: float = 20.0) -> None:
    deadline = time.monotonic() + timeout  # a hang guard, not a speed claim
    while not predicate():
        assert time.monotonic() < deadline, f"timed out: {what}"
        time.sleep(0.005)


def test_the_raft_thread_puts_no_cached_message_of_the_leaders_dump_in_the_caches(
    tmp_path: Path, queues_built: dict[str, int]
) -> None:
    leader = seed_state(300)
    dump = written_dump(tmp_path, leader)
    restored: list[CacheSync] = []
    follower = follower_seed(tmp_path / "follower", restored)
    raft_thread = threading.current_thread().name  # (no tick thread: this one ticks)
    try:
        follower._SyncObj__onMessageReceived(LEADER, dump_message((dump, True, True), 9))
        assert follower._SyncObj__raftCommitIndex == 9  # loaded, and answered
        assert queues_built.get(raft_thread, 0) == 0  # before: 300, every cached message
        cache = follower._status_consumer.cache
        records = restored[0].subjects  # a DumpRecords: the dump's records, decoded in a thread
        wait_until(lambda: records.ready(), "the dump's caches decoded")  # type: ignore[attr-defined]
        cache.settle()
        assert not cache.decoding
        assert queues_built.get("raft-dump-decoder") == 300
        positions = leader.coordinator.positions()
        assert restored[0] == leader.cache.to_sync(6, positions)
        assert cache.to_sync(6, positions) == leader.cache.to_sync(6, positions)
    finally:
        follower.destroy()


@pytest.fixture
def held_decoding(monkeypatch: pytest.MonkeyPatch) -> Iterator[threading.Event]:
    """Every decoding waits until the event is set (set at the end of the test)."""
    gate = threading.Event()
    decode = dump_decoder.decode

    def held(packed: bytes, *what: str) -> Any:
        if threading.current_thread().name == "raft-dump-decoder":
            assert gate.wait(30)
        return decode(packed, *what)

    monkeypatch.setattr(dump_decoder, "decode", held)
    yield gate
    gate.set()


def written_and_loaded(budget: int) -> tuple[ReplicatedCache, bytes, ReplicatedCache]:
    """A seed's caches after 70 batches, their dump, and the same loaded at once (as a
    dump of the code before loads: the eager path)."""
    written = ReplicatedCache(5, budget)
    for batch in commits(0, 70):
        written.append(batch)
    eager = ReplicatedCache.__new__(ReplicatedCache)
    eager.__setstate__(written.caches_state())
    return written, pickle.dumps(written), eager


def test_batches_applied_while_a_dump_decodes_leave_the_caches_a_load_at_once_leaves(
    held_decoding: threading.Event,
) -> None:
    _, dump, eager = written_and_loaded(10**6)
    lazy = pickle.loads(dump)
    assert lazy.decoding
    smaller = 20 * 60
    for cache in (eager, lazy):
        cache.set_budget(smaller)  # the seed's own: drops the oldest, before the sync
    lazy.begin_decoding()
    sync = lazy.to_sync(70, POSITIONS)
    expected_sync = eager.to_sync(70, POSITIONS)
    for batch in commits(70, 30):  # applied to the caches while they decode
        eager.append(batch)
        lazy.append(batch)
    lazy.set_budget(smaller * 2)
    eager.set_budget(smaller * 2)
    lazy.settle()  # not decoded: nothing taken, nothing waited for
    assert lazy.decoding and not sync.subjects.ready()  # type: ignore[attr-defined]
    held_decoding.set()
    assert sync == expected_sync  # (waits for the decoding)
    lazy.settle()
    assert not lazy.decoding
    assert lazy.caches_state() == eager.caches_state()
    assert lazy.snapshot_count == eager.snapshot_count > 0
    assert lazy.budget is not None and eager.budget is not None
    assert lazy.budget.bytes == eager.budget.bytes


def in_a_forked_writer(cache: ReplicatedCache) -> bytes:
    """``pickle.dumps(cache)`` in a forked child, as pysyncobj's dump writer does it."""
    reader, writer = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: whatever happens, it ends here
        try:
            os.write(writer, pickle.dumps(cache))  # (a pipe's buffer holds these few KB)
        finally:
            os._exit(0)
    os.close(writer)
    chunks = []
    try:
        while select.select([reader], [], [], 20)[0]:
            chunk = os.read(reader, 1 << 16)
            if not chunk:
                break
            chunks.append(chunk)
        else:
            raise AssertionError("the forked writer wrote nothing in 20 s (waiting?)")
    finally:
        os.close(reader)
        if os.waitpid(pid, os.WNOHANG) == (0, 0):
            os.kill(pid, 9)
            os.waitpid(pid, 0)
    return b"".join(chunks)


def test_a_dump_written_while_the_last_one_decodes_holds_the_whole_state(
    held_decoding: threading.Event,
) -> None:
    """A compaction right after a dump's load: pysyncobj forks its writer, where the
    thread decoding the caches does not run; the writer decodes them itself."""
    _, dump, eager = written_and_loaded(10**6)
    lazy = pickle.loads(dump)
    lazy.begin_decoding()
    for batch in commits(70, 12):
        eager.append(batch)
        lazy.append(batch)
    assert lazy.decoding
    again = pickle.loads(in_a_forked_writer(lazy))
    assert again.caches_state() == eager.caches_state()


def damaged_writer(monkeypatch: pytest.MonkeyPatch, damage: str) -> None:
    """The dump writer packs its caches damaged: a byte changed after its CRC-32
    (``changed``), or bytes that are no pickle under a matching CRC-32 (``no-pickle``)."""
    encode = dump_decoder.encode

    def damaged(state: Any) -> tuple[bytes, int]:
        packed, crc = encode(state)
        if damage == "changed":
            return packed[:9] + bytes([packed[9] ^ 0x5A]) + packed[10:], crc
        packed = zlib.compress(b"not a pickle")
        return packed, zlib.crc32(packed)

    monkeypatch.setattr(replicated_cache, "encode", damaged)


def test_a_dump_whose_caches_are_damaged_is_refused_and_the_whole_one_taken(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture,
) -> None:
    leader = seed_state(300)
    damaged_writer(monkeypatch, "changed")
    bad = written_dump(tmp_path, leader)
    monkeypatch.undo()
    whole = written_dump(tmp_path, leader)
    restored: list[CacheSync] = []
    follower = follower_seed(tmp_path / "follower", restored)
    try:
        log_before = list(follower._SyncObj__raftLog[:])
        sent_before = len(follower._SyncObj__transport.sent)
        with caplog.at_level(logging.WARNING):
            follower._SyncObj__onMessageReceived(LEADER, dump_message((bad, True, True), 9))
        assert "damaged: CRC-32" in caplog.text and "cannot load the leader's dump" in caplog.text
        assert "damaged on the way" in caplog.text  # (not "another version")
        assert list(follower._SyncObj__raftLog[:]) == log_before and restored == []
        assert len(follower._SyncObj__transport.sent) == sent_before  # no success sent
        follower._SyncObj__onMessageReceived(LEADER, dump_message((whole, True, True), 9))
        assert follower._SyncObj__raftCommitIndex == 9
        positions = leader.coordinator.positions()
        assert restored == [leader.cache.to_sync(6, positions)]
    finally:
        follower.destroy()


def test_a_seed_whose_dump_does_not_decode_stops_naming_the_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture,
) -> None:
    """Its CRC-32 matched, so the Raft thread took it; the decoding fails: the seed's
    caches are not the other seeds', and it stops (the member exits, saying why)."""
    leader = seed_state(300)
    damaged_writer(monkeypatch, "no-pickle")
    bad = written_dump(tmp_path, leader)
    restored: list[CacheSync] = []
    follower = follower_seed(tmp_path / "follower", restored)
    follower._poller.poll = lambda timeout: None
    try:
        follower._SyncObj__onMessageReceived(LEADER, dump_message((bad, True, True), 9))
        with caplog.at_level(logging.CRITICAL):
            wait_until(lambda: follower._onTick(0) or follower.stopped, "the seed stopped")
        assert "do not decode" in follower.stopped
        assert str(tmp_path / "follower" / "raft.dump") in follower.stopped
        assert "ClusterDataDir" in caplog.text
        with pytest.raises(ValueError, match="do not decode"):  # the install refuses it
            list(restored[0].subjects)
    finally:
        follower.destroy()


def test_a_follower_that_took_long_to_load_the_leaders_dump_does_not_stand_at_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
) -> None:
    """While it loads, the leader's AppendEntries wait unread; its election deadline had
    been set when the dump's last part came: a load longer than the election timeout
    made it stand at its next tick, before reading them, and its higher term deposed
    the leader. Now the deadline starts again from the load's end."""
    clock = [1000.0]
    monkeypatch.setattr(pysyncobj.syncobj, "monotonicTime", lambda: clock[0])
    monkeypatch.setattr(cluster.raft_follower, "monotonicTime", lambda: clock[0])
    deserialize = CoordinationConsumer._deserialize

    def slow(consumer: CoordinationConsumer, data: Any) -> None:
        deserialize(consumer, data)
        clock[0] += 3.0  # longer than any election timeout here (pysyncobj's 0.4-1.4 s)

    monkeypatch.setattr(CoordinationConsumer, "_deserialize", slow)
    dump = written_dump(tmp_path, seed_state(50))
    follower = follower_seed(tmp_path / "follower", [])
    follower._poller.poll = lambda timeout: None
    try:
        follower._onTick(0)  # its start-up tick (no dump of its own to load)
        follower._SyncObj__connectedNodes.add(LEADER)  # linked: it may stand
        follower._empty_start.active = False  # a seed with its disk (cluster/raft_votes.py)
        follower._SyncObj__onMessageReceived(LEADER, dump_message((dump, True, True), 1))
        assert follower._SyncObj__raftCommitIndex == 1  # (the dump loaded)
        follower._onTick(0)
        assert follower._SyncObj__raftState == _RAFT_STATE.FOLLOWER  # before: CANDIDATE,
        # and since pre-vote its deadline passed shows as a round of pre-votes begun
        assert follower._pre_vote is None or follower._pre_vote.round == 0
        clock[0] += 5.0  # and a leader silent for real is stood against: after one round
        follower._onTick(0)  # of pre-votes (cluster/raft_prevote_node.py), unanswered here
        assert follower._SyncObj__raftState == _RAFT_STATE.FOLLOWER
        clock[0] += 5.0
        follower._onTick(0)
        assert follower._SyncObj__raftState == _RAFT_STATE.CANDIDATE
    finally:
        follower.destroy()


def test_a_seed_restarted_from_its_dump_reads_it_once_and_gets_every_batch_back(
    tmp_path: Path, queues_built: dict[str, int], monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A real seed (its Raft thread, its files): 40 batches of 5 messages, a compaction,
    10 more batches, a stop; started again, it reads its dump once (twice before: once
    to see where it ends, ``_keep_journal_after_dump``, then to load it), its Raft
    thread puts none of the dump's cached messages into the caches, and every batch is
    back -- the dump's caches, then the 10 after it."""
    import pysyncobj.pickle as pysyncobj_pickle
    from test_raft_dump_load import batch
    from test_raft_dump_restart import free_port, wait_for

    from cluster.coordination import CommittedBatch
    from cluster.raft import RaftCoordination, RaftTimings

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

    committed: list[CommittedBatch] = []
    raft = seed(committed, [])
    try:
        wait_for(lambda: raft.snapshot.ready)
        commit(raft, 0, 40)
        raft.syncobj.forceLogCompaction()
        wait_for(lambda: (tmp_path / "raft.dump").exists())
        commit(raft, 40, 10)
    finally:
        raft.close()
    assert committed[-1].clsn == 50
    reads: list[str] = []
    load = pysyncobj_pickle.load

    def counted(file: Any) -> Any:
        reads.append(threading.current_thread().name)
        return load(file)

    monkeypatch.setattr(pysyncobj_pickle, "load", counted)
    queues_built.clear()
    again: list[CommittedBatch] = []
    restored: list[CacheSync] = []
    raft = seed(again, restored)
    try:
        wait_for(lambda: raft.snapshot.ready and raft.snapshot.clsn >= 50)
        raft_thread = set(reads)
    finally:
        raft.close()
    assert len(reads) == 1  # before: 2
    assert sum(queues_built.get(name, 0) for name in raft_thread) == 0  # before: 200
    (sync,) = restored
    assert sync.clsn == 40 and [b.clsn for b in again] == list(range(41, 51))
    messages = {m.content for record in sync.subjects for m in record.cached}
    messages |= {m.content for b in again for m in b.messages}
    assert messages == {b"c%d" % n for n in range(250)}
