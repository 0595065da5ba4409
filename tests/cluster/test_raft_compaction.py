"""A leader that compacts more often than its dump takes to send (cluster/raft_compaction.py):
real pysyncobj nodes on the simulated network of :mod:`raft_sim`."""

from __future__ import annotations

import errno
import os
import pickle
import random
from pathlib import Path
from typing import Any

import pytest
from pysyncobj.journal import FileJournal
from raft_schedules import left_behind
from raft_sim import RaftWorld

from cluster import raft_compaction
from cluster.raft_disk import RaftDiskFailure
from cluster.raft_follower import FollowerSafeSyncObj


class CompactsWhileSending(FollowerSafeSyncObj):
    """pysyncobj's own leader: a new dump restarts every transmission in progress."""

    def _dump_on_its_way(self) -> bool:
        return False


def cut_off_then_back_under_load(
    node_class: type[Any], *, compaction_entries: int | None = 6, compaction_bytes: int = 0
) -> tuple[RaftWorld, str]:
    """C is cut off while 60 entries of 400 random bytes commit (a dump of ~100 parts of
    256 B; a round sends ~10); back, it needs the dump, while the leader goes on
    committing -- and compacting every 6 entries (or as many bytes)."""
    world = RaftWorld(3, node_class=node_class, seed=3, compaction_entries=compaction_entries,
                      compaction_bytes=compaction_bytes, dump_part_bytes=256,
                      send_seconds=0.004)
    _, c = left_behind(world, entries=60, size=400, seed=5)
    rnd = random.Random(6)
    for i in range(150):
        if world.leader():
            world.submit(world.leader(), b"w%03d" % i + rnd.randbytes(400))
        world.step(0.05)
    return world, c


def applied(world: RaftWorld, address: str) -> int:
    return len(world.recorders[address].applied)


def test_the_cut_off_seed_catches_up_from_one_dump() -> None:
    world, c = cut_off_then_back_under_load(FollowerSafeSyncObj)
    try:
        assert world.violations() == []
        assert world.dumps_installed >= 1
        most = max(applied(world, a) for a in world.addresses)
        assert applied(world, c) >= most - 2, (applied(world, c), most)
    finally:
        world.close()


def test_with_pysyncobj_s_compaction_it_never_does() -> None:
    """The livelock (chaos seed 4 showed its real-process form, docs/cluster.md)."""
    world, c = cut_off_then_back_under_load(CompactsWhileSending)
    try:
        assert world.dumps_installed == 0
        assert world.dump_parts_sent > 500
        assert applied(world, c) == 0
    finally:
        world.close()


def test_the_wait_is_bounded(monkeypatch: pytest.MonkeyPatch) -> None:
    """A transmission that cannot finish does not keep the log growing for ever."""
    monkeypatch.setattr(raft_compaction, "MAX_WAIT_SECONDS", 0.1)
    world, _ = cut_off_then_back_under_load(FollowerSafeSyncObj)
    try:
        warned = [r for r in world.logs.records if "although a dump is still" in r.getMessage()]
        assert warned, "the leader compacts once it has waited long enough"
        leader = world.leader()
        assert leader is not None
        assert len(world.nodes[leader]._SyncObj__raftLog) <= 4 * 6 + 2
    finally:
        world.close()


def test_the_wait_is_bounded_by_the_logs_bytes_too() -> None:
    """Compacting by ClusterLogCompactionBytes, a leader waiting for its dump on its way
    compacts anyway once its log takes four times that (the memory a seed may hold for
    its log: tests/deploy/test_k8s_sizing.py), well before the 60 s."""
    limit = 1_000  # ~2 entries
    world, _ = cut_off_then_back_under_load(FollowerSafeSyncObj, compaction_entries=None,
                                            compaction_bytes=limit)
    try:
        warned = [r for r in world.logs.records if "although a dump is still" in r.getMessage()]
        assert warned, "the leader compacts once its log is four times the bound"
        waited: list[float] = [r.args[1] for r in warned]  # type: ignore[index]
        assert max(waited) < raft_compaction.MAX_WAIT_SECONDS, waited  # not the 60 s
        leader = world.leader()
        assert leader is not None
        log = world.nodes[leader]._SyncObj__raftLog
        assert raft_compaction.log_bytes(log) <= 4 * limit + 2 * 440
    finally:
        world.close()


def test_a_leader_that_steps_down_mid_transmission_forgets_it() -> None:
    """The leader has begun sending C its dump when it is cut off from B and deposed
    (B and C elect; C, still linked to it, tells it the new term): its transmissions
    are dropped (pysyncobj kept them: led again, it resumed C's stale one
    and postponed its compaction for it). What it sends C is held meanwhile (a stalled
    link, not a broken one, which would end the transmission): C, hearing the leader,
    would grant B no pre-vote (cluster/raft_prevote.py)."""
    world = RaftWorld(3, seed=3, compaction_entries=6, dump_part_bytes=64, send_seconds=0.001)
    try:
        leader, c = left_behind(world, entries=30, size=200, seed=5)
        world.clock.now += 0.05
        world.tick(leader)
        serializer = world.nodes[leader]._SyncObj__serializer
        assert serializer._Serializer__transmissions, "C's dump is on its way"
        b = next(address for address in world.addresses if address not in (leader, c))
        world.cut(leader, b)  # B and C elect a leader; C tells the old one (still linked)
        for _ in range(60):
            world.clock.now += 0.05
            world.tick_all()
            while sum(world.deliver(s, t, 10**9) for s, t in list(world.queues)
                      if (s, t) != (leader, c)):
                pass
            if world.nodes[leader]._SyncObj__raftState != 2:
                break
        assert world.nodes[leader]._SyncObj__raftState != 2, "it stepped down"
        world.tick(leader)
        assert not serializer._Serializer__transmissions
    finally:
        world.close()


def test_a_seed_compacts_once_its_log_takes_more_bytes_than_the_bound() -> None:
    """pysyncobj keeps the whole log in memory as well as on disk until a compaction,
    and its thresholds count entries and seconds only: under load a seed's memory grew
    with the publish rate, beyond every budget (benchmarks/raft_log_memory.py: 310 bytes
    a 100-byte publish, ~1 GB over one ClusterLogCompactionTime at the ceiling). With
    ClusterLogCompactionBytes each seed compacts once its log's entries take more."""
    limit, size, count = 16_000, 400, 150  # four times the bound in all
    world = RaftWorld(3, seed=3, compaction_bytes=limit, dump_part_bytes=4096,
                      send_seconds=0.001)
    try:
        rnd = random.Random(7)
        largest = submitted = 0
        for i in range(count):
            if world.leader():
                world.submit(world.leader(), b"b%03d" % i + rnd.randbytes(size))
                submitted += 1
            world.step(0.02)
            largest = max(largest, *(raft_compaction.log_bytes(node._SyncObj__raftLog)
                                     for node in world.nodes.values()))
        world.step(1.0)
        assert world.violations() == []
        assert len(world.acknowledged) == submitted > count // 2
        assert largest <= limit + 4 * (size + 40), largest  # a few entries past the bound
    finally:
        world.close()


def test_each_seed_has_its_own_compaction_factor() -> None:
    """Seeds with one threshold compacted at the same index and forked their dump
    writers together: every member stalled in that second."""
    seeds = [f"127.0.0.1:{port}" for port in (7101, 7111, 7121)]
    seeds += [f"migratory-{i}.migratory.default.svc:8801" for i in range(3)]
    factors = [raft_compaction.compaction_stagger(seed) for seed in seeds]
    assert all(1.0 <= f <= 1.0 + raft_compaction.STAGGER for f in factors)
    assert len(set(factors)) == len(factors)
    assert factors == [raft_compaction.compaction_stagger(seed) for seed in seeds]


def test_a_seed_raft_node_compacts_at_its_own_thresholds() -> None:
    from cluster.raft import RaftCoordination, RaftTimings, raft_address
    from cluster.tooling import free_base_port

    address = ("127.0.0.1", free_base_port(1))
    node = RaftCoordination(
        self_address=address, seed_addresses=[address], password="compaction",
        on_commit=lambda _batch: None,
        timings=RaftTimings(compaction_entries=2000, compaction_seconds=10.0),
    )
    try:
        factor = raft_compaction.compaction_stagger(raft_address(address))
        conf = node.syncobj._SyncObj__conf
        assert conf.logCompactionMinEntries == int(2000 * factor)
        assert conf.logCompactionMinTime == pytest.approx(10.0 * factor)
    finally:
        node.close()


def journal_of(path: Path, entries: int) -> FileJournal:
    journal = FileJournal(str(path))
    for index in range(1, entries + 1):
        journal.add(b"\x00" + pickle.dumps(("v", index), protocol=2), index, 2)
    journal.setCurrentTerm(3, "127.0.0.1:2")
    journal.setRaftCommitIndex(90)
    return journal


class Killed(Exception):
    """The process stopped here (as by SIGKILL: what was written stays written)."""


@pytest.mark.parametrize("ours", [True, False], ids=["ours", "pysyncobj"])
def test_a_trim_killed_midway_leaves_a_whole_journal(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, ours: bool
) -> None:
    """100 entries, the first 50 dropped (a dump holds them); killed after 10 of the
    entries kept were written. pysyncobj's rewrite in place restarted with 10 entries:
    51..60, where the seed had acknowledged up to 100."""
    path = tmp_path / "raft.journal"
    journal = journal_of(path, 100)
    written = 0
    add = FileJournal.add

    def add_then_die(self: FileJournal, *entry: Any) -> None:
        nonlocal written
        if written == 10:
            raise Killed
        written += 1
        add(self, *entry)

    monkeypatch.setattr(FileJournal, "add", add_then_die)
    with pytest.raises(Killed):
        if ours:
            raft_compaction.trimmed(journal, 50, str(path))
        else:
            journal.deleteEntriesTo(50)
    monkeypatch.undo()
    again = FileJournal(str(path))
    indices = [entry[1] for entry in again[:]]
    if ours:
        assert indices == list(range(1, 101)), "the journal before the trim"
    else:
        assert indices == list(range(51, 61)), "pysyncobj changed its trim"


def test_a_trim_keeps_the_entries_after_it_and_the_term_and_vote(tmp_path: Path) -> None:
    path = tmp_path / "raft.journal"
    journal = journal_of(path, 100)
    kept = journal[50:]
    after = raft_compaction.trimmed(journal, 50, str(path))
    assert after[:] == kept
    after.add(b"\x01", 101, 3)
    after._destroy()
    again = FileJournal(str(path))
    assert again[:] == [*kept, (b"\x01", 101, 3)]
    assert (again.getCurrentTerm(), again.getVotedForNodeId()) == (3, "127.0.0.1:2")
    assert again.getRaftCommitIndex() == 90
    assert not Path(str(path) + raft_compaction.TRIM_SUFFIX).exists()


def test_a_trim_that_fails_stops_the_seed_and_leaves_a_whole_journal(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The rename fails (EIO) after the old journal was closed: a plain ``OSError``
    there reached pysyncobj's tick loop, which retried every tick on the closed journal
    (``I/O operation on closed file``) instead of stopping."""
    path = tmp_path / "raft.journal"
    journal = journal_of(path, 100)
    replace = os.replace

    def failing(source: str, target: str) -> None:
        if str(source).endswith(raft_compaction.TRIM_SUFFIX):
            raise OSError(errno.EIO, os.strerror(errno.EIO))
        replace(source, target)

    monkeypatch.setattr(os, "replace", failing)
    with pytest.raises(RaftDiskFailure, match=r"cannot write .*raft.journal \(Input/output"):
        raft_compaction.trimmed(journal, 50, str(path))
    monkeypatch.undo()
    assert [entry[1] for entry in FileJournal(str(path))[:]] == list(range(1, 101))
    assert not Path(str(path) + raft_compaction.TRIM_SUFFIX).exists(), "its space freed"
