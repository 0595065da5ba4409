"""What a seed's Raft dump holds and how a follower takes it (cluster/raft_dump_files.py,
``DUMP_PROTOCOL``): contents as bytes, a seed's whole state back, an empty state, and a
damaged dump refused without touching the follower's state."""

from __future__ import annotations

import gzip
import io
import logging
import pickletools
from pathlib import Path
from typing import Any

import pytest
from pysyncobj import SyncObjConf
from test_raft_follower import LEADER, dump_message
from test_seed_activity import NoLinks

from cluster import raft_dump_files, raft_unpickler
from cluster.cache_sync import CacheSync
from cluster.raft import CoordinationConsumer, _SeedSyncObj

BEFORE_LAST, LAST = (b"w", 8, 2), (b"x", 9, 2)  # the dump's last two Raft entries


def seed_state(messages: int) -> CoordinationConsumer:
    """A seed's replicated state after ``messages`` publishes over 7 subjects, each its
    own content, some retained with fields (a budget, so its FIFO is in the dump)."""
    consumer = CoordinationConsumer(lambda batch: None, cache_budget=10**8)
    wire = [("seed-0#1", n, f"/s/{n % 7}", b"%06d" % n + bytes(range(200, 250)),
             {"n": str(n)} if n % 3 == 0 else {}, n % 5 == 0, True)
            for n in range(1, messages + 1)]
    for start in range(0, len(wire), 50):
        consumer.commit_batch(11, wire[start:start + 50], _doApply=True)
    return consumer


def written_dump(tmp_path: Path, consumer: CoordinationConsumer) -> bytes:
    """The dump a seed writes of ``consumer`` (as pysyncobj lays it out), as its bytes."""
    path = tmp_path / "leader.dump"
    data = (({}, consumer._serialize()), LAST, BEFORE_LAST, [])
    assert raft_dump_files.write_dump(str(path), data) == 0
    return path.read_bytes()


def test_a_dump_writes_each_content_as_bytes_not_as_a_call(tmp_path: Path) -> None:
    """pysyncobj's protocol 2 writes every ``bytes`` as ``_codecs.encode(text, 'latin1')``:
    a call per cached message for the follower's Raft thread to make (~1 s for 660,000,
    docs/benchmarks.md). Counted: the calls (REDUCE) in a dump of 300 cached messages --
    300 and more on the code before, a few (the enums of the snapshots) now."""
    raw = gzip.decompress(written_dump(tmp_path, seed_state(300)))
    calls = sum(op.name == "REDUCE" for op, _, _ in pickletools.genops(raw))
    assert calls < 20


@pytest.mark.parametrize("messages", [0, 300], ids=["empty", "300-messages"])
def test_a_seeds_dump_loads_back_whole(tmp_path: Path, messages: int) -> None:
    leader = seed_state(messages)
    with gzip.GzipFile(fileobj=io.BytesIO(written_dump(tmp_path, leader))) as g:
        (_, state), last, before_last, _ = raft_unpickler.load(g)
    assert (last, before_last) == (LAST, BEFORE_LAST)
    loaded = state["coordinator"]
    assert loaded.digest() == leader.coordinator.digest() and loaded.clsn == messages // 50
    positions = leader.coordinator.positions()
    assert state["cache"].to_sync(1, positions) == leader.cache.to_sync(1, positions)
    assert state["cache"].budget.bytes == leader.cache.budget.bytes


def follower_seed(tmp_path: Path, restored: list[CacheSync]) -> Any:
    """A seed's Raft node keeping its dump in ``tmp_path`` (no tick thread, no network)."""
    tmp_path.mkdir()
    conf = SyncObjConf(autoTick=False, password="dump-protocol",
                       fullDumpFile=str(tmp_path / "raft.dump"),
                       journalFile=str(tmp_path / "raft.journal"))
    node = _SeedSyncObj(
        "127.0.0.1:47901", ["127.0.0.1:47902", "127.0.0.1:47903"], conf=conf,
        transportClass=NoLinks,
        consumer=CoordinationConsumer(lambda batch: None, restored.append),
    )
    node._term_quorum.waiting = False  # it knows the current term (no seed to ask)
    return node


def damaged(dump: bytes) -> bytes:
    """``dump`` with a byte of its compressed data changed (past the gzip header)."""
    at = len(dump) // 2
    return dump[:at] + bytes([dump[at] ^ 0x5A]) + dump[at + 1:]


@pytest.mark.parametrize("harm", [damaged, lambda d: d[: len(d) // 2]],
                         ids=["a-byte-changed", "cut-short"])
def test_a_damaged_dump_from_the_leader_is_refused_and_the_whole_one_taken(
    tmp_path: Path, harm: Any, caplog: pytest.LogCaptureFixture,
) -> None:
    """A follower sent a damaged dump says so, keeps its log and its state, and answers
    nothing (the leader sends its dump again); the whole dump then loads."""
    leader = seed_state(300)
    dump = written_dump(tmp_path, leader)
    restored: list[CacheSync] = []
    follower = follower_seed(tmp_path / "follower", restored)
    try:
        consumer = follower._status_consumer
        log_before = list(follower._SyncObj__raftLog[:])
        sent_before = len(follower._SyncObj__transport.sent)
        with caplog.at_level(logging.WARNING):
            follower._SyncObj__onMessageReceived(
                LEADER, dump_message((harm(dump), True, True), commit=9))
        assert "cannot load the leader's dump" in caplog.text
        assert "damaged on the way" in caplog.text  # (not "another version")
        assert list(follower._SyncObj__raftLog[:]) == log_before
        assert follower._SyncObj__raftCommitIndex == 1
        assert consumer.coordinator.clsn == 0 and restored == []
        assert len(follower._SyncObj__transport.sent) == sent_before  # no success sent
        follower._SyncObj__onMessageReceived(
            LEADER, dump_message((dump, True, True), commit=9))
        assert follower._SyncObj__raftCommitIndex == 9
        assert consumer.coordinator.digest() == leader.coordinator.digest()
        assert [sync.clsn for sync in restored] == [6]
        assert len(restored[0].subjects) == 7
    finally:
        follower.destroy()

