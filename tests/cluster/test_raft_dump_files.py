"""A Raft dump that cannot be written stops the seed, naming the file and the reason
(cluster/raft_dump_files.py): a seed's own dump, written by a forked child, on a real
single-seed node; the leader's dump, received by a follower, on the Raft simulation."""

from __future__ import annotations

import logging
import os
import resource
import signal
import time
from pathlib import Path
from typing import Any

import pytest
from listen_ports import listen_port
from pysyncobj import syncobj as pysyncobj_syncobj
from pysyncobj.config import SERIALIZER_STATE
from pysyncobj.serializer import Serializer
from raft_schedules import left_behind
from raft_sim import RaftWorld
from test_raft_disk import submit, wait_for

from cluster import raft_dump_files
from cluster.coordination import CommittedBatch
from cluster.raft import RaftCoordination, RaftTimings
from cluster.raft_disk import RaftDiskFailure


def counted_forks(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """The pids of the processes ``os.fork`` makes from now on (pysyncobj's dump writers)."""
    forks: list[int] = []
    fork = os.fork

    def counted_fork() -> int:
        pid = fork()
        if pid:
            forks.append(pid)
        return pid

    monkeypatch.setattr(os, "fork", counted_fork)
    return forks


def compacting_seed(data_dir: Path, port: int, committed: list[CommittedBatch]) -> Any:
    return RaftCoordination(
        self_address=("127.0.0.1", port), seed_addresses=[("127.0.0.1", port)],
        password="x", on_commit=committed.append, data_dir=data_dir,
        timings=RaftTimings(compaction_entries=10, compaction_seconds=3600),
    )


def a_directory_in_its_place(data_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (data_dir / "raft.dump.tmp").mkdir()  # open(..., "wb") fails: EISDIR


def past_a_size_limit(data_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The dump writer (the forked child, only it) may not write a file past 256 bytes
    (a dump here is ~580: 512 let one written in pickle protocol 4 through now and
    then): it fails part-way with EFBIG, as on a full disk with ENOSPC."""
    write_dump = raft_dump_files.write_dump

    def limited(path: str, data: Any, **kwargs: Any) -> int:
        signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGXFSZ})
        resource.setrlimit(resource.RLIMIT_FSIZE, (256, 256))
        return write_dump(path, data, **kwargs)

    monkeypatch.setattr(raft_dump_files, "write_dump", limited)


@pytest.mark.parametrize(("fault", "why"), [
    (a_directory_in_its_place, "[Errno 21] cannot write {} (Is a directory)"),
    (past_a_size_limit, "[Errno 27] cannot write {} (File too large)"),
], ids=["directory", "size-limit"])
def test_a_seed_whose_dump_cannot_be_written_stops_saying_why(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, fault: Any, why: str,
) -> None:
    """pysyncobj's dump writer exits -1 on any error: its parent logged "Failed to store
    full dump" (no file, no reason) and forked the next writer at the next tick, ten a
    second (measured: 66 forks in 7 s), leaving its part-written file on the disk."""
    forks = counted_forks(monkeypatch)
    fault(tmp_path, monkeypatch)
    port, committed = listen_port(), []  # type: ignore[var-annotated]
    raft = compacting_seed(tmp_path, port, committed)
    try:
        wait_for(lambda: raft.snapshot.ready)
        for _ in range(40):  # past the compaction threshold (10 to 15 entries)
            if raft.snapshot.stopped is not None or not submit(raft, 0.3):
                break
        wait_for(lambda: raft.snapshot.stopped is not None)
        assert raft.snapshot.stopped == why.format(tmp_path / "raft.dump.tmp")
        acknowledged = committed[-1].clsn
    finally:
        raft.close()
    assert len(forks) == 1, "one dump writer, not one a tick"
    assert not (tmp_path / "raft.dump").exists()
    if fault is past_a_size_limit:
        assert not (tmp_path / "raft.dump.tmp").exists(), "its part-written file removed"
    else:
        (tmp_path / "raft.dump.tmp").rmdir()
    monkeypatch.undo()
    again: list[CommittedBatch] = []
    raft = compacting_seed(tmp_path, port, again)
    try:  # mended: the journal holds everything acknowledged; it commits and compacts
        wait_for(lambda: raft.snapshot.ready and raft.snapshot.clsn >= acknowledged)
        for _ in range(20):
            assert submit(raft, 5)
        wait_for(lambda: (tmp_path / "raft.dump").exists())
    finally:
        raft.close()


def test_a_seed_whose_dump_fails_not_for_the_disk_runs_on_and_counts_it(
    tmp_path: Path,
) -> None:
    """A real seed (its dump writer forked): a dump that cannot be pickled does not stop
    it; it still commits, and GET /cluster counts the failure (/metrics from it:
    migratory_raft_dump_failures_total)."""
    port, committed = listen_port(), []  # type: ignore[var-annotated]
    raft = compacting_seed(tmp_path, port, committed)
    try:
        wait_for(lambda: raft.snapshot.ready)
        # pickled with the replicated state (the node's own attributes are not: raft_own_state)
        raft.syncobj._status_consumer.unpicklable = lambda: None
        for _ in range(40):  # past the compaction threshold (10 to 15 entries)
            if raft.status()["raft_dump_failures"] or not submit(raft, 0.3):
                break
        wait_for(lambda: raft.status()["raft_dump_failures"] >= 1)
        assert raft.status()["raft_stopped"] is None
        assert submit(raft, 5)
    finally:
        raft.close()
    assert not (tmp_path / "raft.dump").exists()
    assert not (tmp_path / "raft.dump.tmp").exists()


def test_a_follower_that_cannot_write_the_leaders_dump_stops() -> None:
    """pysyncobj's follower logged a traceback ("Failed to open file for incoming
    transition", or "...write incoming transition data") and dropped the dump; the
    leader sent it again, to fail again. Here the failure reaches the tick (the seed
    stops there: cluster/raft.py), and the part-written file is removed."""
    world = RaftWorld(3, seed=3, compaction_entries=6, dump_part_bytes=256,
                      send_seconds=0.004)
    try:
        _, behind = left_behind(world, entries=30, size=100, seed=5)
        incoming = world.dir / f"{behind.replace(':', '_')}.dump.1.tmp"
        incoming.mkdir()
        transport = world.nodes[behind]._SyncObj__transport
        received, failures = transport._onMessageReceived, []

        def receive(peer: Any, message: Any) -> None:
            try:
                received(peer, message)
            except RaftDiskFailure as exc:
                failures.append(str(exc))  # a seed stops here (cluster/raft.py)
                raise

        transport._onMessageReceived = receive
        for _ in range(60):
            world.step(0.05)
            if failures:
                break
        assert failures and failures[0] == (
            f"[Errno 21] cannot write {incoming} (Is a directory)")
    finally:
        world.close()


def test_a_dump_that_fails_not_for_the_disk_is_said_once_then_tried_less_often(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A dump that cannot be pickled (an attribute set on the node after start: pysyncobj
    pickles them all) is a bug, not the disk: it was tried again at every tick, a
    warning each time and pysyncobj's "Failed to store full dump" after it. Now: its
    traceback once at ERROR, then tries 1, 2, 4 ... up to 60 s apart, each failure one
    line with its count; the seed runs on (its log uncompacted) and compacts again once
    the dump can be written."""
    tries: list[str] = []
    write_dump = raft_dump_files.write_dump

    def counted(path: str, data: Any, **kwargs: Any) -> int:
        tries.append(path)
        return int(write_dump(path, data, **kwargs))

    monkeypatch.setattr(raft_dump_files, "write_dump", counted)
    world = RaftWorld(3, seed=3, compaction_entries=6, send_seconds=0.004)
    try:
        for _ in range(20):
            world.step(0.05)
        leader = world.leader()
        assert leader is not None
        buggy = next(address for address in world.addresses if address != leader)
        node = world.nodes[buggy]
        state = world.recorders[buggy]  # its replicated state (raft_own_state.py)
        state.unpicklable = lambda: None  # pickled with the state's other attributes
        dump = world.dir / f"{buggy.replace(':', '_')}.dump"
        for i in range(10):  # past compaction_entries: the node tries to compact
            world.submit(leader, b"v%04d" % i)
            world.step(0.1)
        for _ in range(200):  # 20 s
            world.step(0.1)
        failed = [path for path in tries if path == str(dump)]
        assert 4 <= len(failed) <= 6, len(failed)  # at 0, 1, 3, 7, 15 s (before: each tick)
        assert not dump.exists()
        lines = world.logs.records  # WARNING and above of pysyncobj and migratory.raft
        tracebacks = [r for r in lines if r.exc_info]
        assert len(tracebacks) == 1 and tracebacks[0].levelno == logging.ERROR
        assert "Can't pickle local object" in tracebacks[0].getMessage()
        again = [r.getMessage() for r in lines if not r.exc_info]
        assert len(again) == len(failed), again
        assert f"failed, {len(failed)} in a row over " in again[-1], again[-1]
        assert node._dump_retries.total == len(failed)
        del state.unpicklable  # mended: the next try writes it
        for _ in range(200):  # the next try, within 16 s
            world.step(0.1)
            if dump.exists():
                break
        assert dump.exists()
        assert "written again after" in world.logs.records[-1].getMessage()
    finally:
        world.close()


def killed(path: str, data: Any, **kwargs: Any) -> int:
    os.kill(os.getpid(), signal.SIGKILL)  # as by the OOM killer
    return 0


@pytest.mark.parametrize(("writer", "why"), [
    (None, "not a disk failure but a bug (its traceback logged at the first failure)"),
    (killed, "its writer was killed by signal SIGKILL (out of memory?)"),
], ids=["unpicklable", "killed"])
def test_a_forked_dump_writer_that_fails_not_for_the_disk_is_tried_less_often(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture,
    writer: Any, why: str,
) -> None:
    """A seed's own dumps are written by a forked child: pysyncobj's serializer asked as
    its tick does (checkSerializing, then serialize when not serializing), 20 s of ticks
    on a clock the test moves. Before: a fork at every other tick (~100)."""
    caplog.set_level(logging.INFO, logger="migratory.raft")
    if writer is not None:
        monkeypatch.setattr(raft_dump_files, "write_dump", writer)
    clock = [1000.0]
    monkeypatch.setattr(pysyncobj_syncobj, "monotonicTime", lambda: clock[0])
    forks = counted_forks(monkeypatch)
    serializer = Serializer(str(tmp_path / "raft.dump"), 2**16, True, None, None, None)
    raft_dump_files.stop_on_disk_failures(serializer)
    ends = []  # what checkSerializing told pysyncobj once each writer ended
    for _ in range(200):
        serializer.serialize(({"unpicklable": lambda: None}, None, None, None), 1)
        for _ in range(5000):  # the writer's end: at most ~5 s
            state, _ = serializer.checkSerializing()
            if state != SERIALIZER_STATE.SERIALIZING:
                break
            time.sleep(0.001)
        ends.append(state)
        clock[0] += 0.1
    assert 4 <= len(forks) <= 6, len(forks)  # at 0, 1, 3, 7, 15 s
    # not FAILED: pysyncobj's "Failed to store full dump" would follow each
    assert set(ends) == {SERIALIZER_STATE.NOT_SERIALIZING}
    lines = [r.getMessage() for r in caplog.records if r.name == "migratory.raft"]
    assert len(lines) == len(forks), lines
    assert all(why in line for line in lines), lines
    assert not (tmp_path / "raft.dump.tmp").exists()
