"""A seed whose ClusterDataDir cannot be written stops with one line, its files whole
(cluster/raft_disk.py), on a real single-seed Raft node.

A full disk is made here by failing ``posix_fallocate`` with ENOSPC (a full filesystem
needs a mount): what pysyncobj alone did on a real one -- a 128 KiB tmpfs -- was SIGBUS
in its journal's ``mmap`` write, the process gone without a line (cluster/raft_disk.py).
The term-and-vote file's failure is a real one: a directory where it writes; so is a
journal that cannot grow, in a seed process whose file-size limit (``RLIMIT_FSIZE``)
makes ``ftruncate`` fail with EFBIG (``limited_seed.py``).
"""

from __future__ import annotations

import errno
import json
import logging
import os
import resource
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import trio
from listen_ports import listen_port
from pysyncobj import SyncObj
from pysyncobj.journal import FileJournal
from raft_schedules import left_behind
from raft_sim import RaftWorld

from cluster import raft_data_dir, raft_disk
from cluster.coordination import CommittedBatch, PublishRequest
from cluster.raft import RaftCoordination, RaftStatus, RaftTimings
from cluster.raft_disk import RaftDiskFailure
from cluster.raft_follower import FollowerSafeSyncObj
from cluster.raft_votes import MARKER_SUFFIX
from migratory.model.message import Message

BIG = [PublishRequest("o", 1, Message("/disk/full", b"x" * 3000, {}, False))]


def seed(data_dir: Path, port: int, committed: list[CommittedBatch]) -> RaftCoordination:
    return RaftCoordination(
        self_address=("127.0.0.1", port), seed_addresses=[("127.0.0.1", port)],
        password="x", on_commit=committed.append, data_dir=data_dir,
        timings=RaftTimings(compaction_entries=10**6, compaction_seconds=3600),
    )


def submit(raft: RaftCoordination, timeout: float) -> bool:
    done = threading.Event()
    raft.submit(2, BIG, lambda clsn, error, unknown: done.set() if error is None else None)
    return done.wait(timeout)


def wait_for(predicate, timeout: float = 5) -> None:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.02)


def no_space(fd: int, offset: int, length: int) -> None:
    raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))


def meta_not_writable(data_dir: Path) -> None:
    (data_dir / "raft.journal.meta.tmp").mkdir()


@pytest.mark.parametrize(("fill", "file", "why"), [
    ("journal", "raft.journal", "No space left on device"),
    ("meta", "raft.journal.meta", "Is a directory"),
])
def test_a_seed_that_cannot_write_stops_with_one_line_and_whole_files(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture,
    fill: str, file: str, why: str,
) -> None:
    port, committed = listen_port(), []  # type: ignore[var-annotated]
    raft = seed(tmp_path, port, committed)
    try:
        wait_for(lambda: raft.snapshot.ready)
        assert submit(raft, 5)
        if fill == "journal":
            monkeypatch.setattr(os, "posix_fallocate", no_space)
        else:
            meta_not_writable(tmp_path)
        for _ in range(20):  # until the journal grows, or the term-and-vote file is stored
            if not submit(raft, 0.5):
                break
        wait_for(lambda: raft.snapshot.stopped is not None)
        stopped = raft.snapshot.stopped
        assert stopped is not None and f"{tmp_path / file} ({why})" in stopped
        acknowledged = committed[-1].clsn
        assert not submit(raft, 0.3), "a stopped seed acknowledges nothing"
    finally:
        raft.close()
    monkeypatch.undo()
    critical = [r for r in caplog.records if r.levelno >= logging.ERROR]
    assert len(critical) == 1 and "stops taking part in Raft" in critical[0].getMessage()
    if fill == "meta":
        (tmp_path / "raft.journal.meta.tmp").rmdir()
    journal = str(tmp_path / "raft.journal")
    raft_data_dir.check(journal, str(tmp_path / "raft.dump"), journal + MARKER_SUFFIX)
    again: list[CommittedBatch] = []
    raft = seed(tmp_path, port, again)
    try:  # space again: everything acknowledged is there, and it commits
        wait_for(lambda: raft.snapshot.ready and raft.snapshot.clsn >= acknowledged)
        assert submit(raft, 5) and again[-1].clsn > acknowledged  # (+1: an unacknowledged
        # entry the stopped seed had written may commit now -- an unknown outcome)
    finally:
        raft.close()


def test_the_member_exits_when_its_raft_node_stops(tmp_path: Path) -> None:
    """The seed's task raises the reason: the member prints it and exits 1 (cluster/cli.py
    prints an OSError that ends start-up or the run as ``migratory: ...``)."""
    from test_cluster_seed_readiness import seed_with_status

    stopped = "[Errno 28] cannot write /d/raft.journal (No space left on device)"
    seed_coordination = seed_with_status(tmp_path, RaftStatus(stopped=stopped))
    assert seed_coordination.not_ready_reason() == f"Raft stopped: {stopped}"
    with pytest.raises(OSError, match=r"Raft stopped: \[Errno 28\] cannot write /d/raft"):
        trio.run(seed_coordination._exit_when_raft_stops)
    seed_coordination.raft = SimpleNamespace(snapshot=RaftStatus())  # type: ignore[assignment]

    async def still_running() -> bool:
        with trio.move_on_after(0.3) as waited:
            await seed_coordination._exit_when_raft_stops()
        return waited.cancelled_caught

    assert trio.run(still_running), "a Raft node that did not stop ends nothing"


def test_the_member_leaves_before_it_exits(tmp_path: Path) -> None:
    """Its submits end first (its publishes go through another seed), then it leaves
    (cluster/node.py: another seed's stream, a drain), then it exits: the member used to
    exit at once, its clients' publishes refused RAFT_STOPPED or left unanswered."""
    from test_cluster_seed_readiness import seed_with_status

    stopped = "[Errno 28] cannot write /d/raft.journal (No space left on device)"
    seed_coordination = seed_with_status(tmp_path, RaftStatus(stopped=stopped))
    steps: list[str] = []

    async def leave(reason: str) -> None:
        steps.append(f"submits ended: {submitting.cancel_called}")
        steps.append(reason)

    seed_coordination.leave = leave
    submitting = trio.CancelScope()
    with pytest.raises(OSError, match="Raft stopped"):
        trio.run(seed_coordination._exit_when_raft_stops, submitting)
    assert steps == ["submits ended: True", stopped]


class SwallowsDiskFailures(FollowerSafeSyncObj):  # type: ignore[misc]
    """Loads dumps as pysyncobj does: any error logged ("failed to load full dump")."""

    def _SyncObj__loadDumpFile(self, clearJournal: bool) -> None:
        if not clearJournal:
            self._keep_journal_after_dump()
        SyncObj._SyncObj__loadDumpFile(self, clearJournal)


@pytest.mark.parametrize("node_class", [FollowerSafeSyncObj, SwallowsDiskFailures],
                         ids=["ours", "pysyncobj"])
def test_a_failed_write_while_loading_the_leaders_dump_is_not_acknowledged(
    node_class: type[FollowerSafeSyncObj],
) -> None:
    """A seed left behind gets the leader's dump; writing its last entry into the journal
    fails (disk full: pysyncobj has put it in its log in memory already). pysyncobj's
    dump loading logs the error and goes on, and the seed answered success for an entry
    its journal lacks. Here the failure reaches the tick (the seed stops there)."""
    world = RaftWorld(3, node_class=node_class, seed=3, compaction_entries=6,
                      dump_part_bytes=256, send_seconds=0.004)
    try:
        _, behind = left_behind(world, entries=30, size=100, seed=5)
        node = world.nodes[behind]
        serializer = node._SyncObj__serializer
        read, adds, answered = serializer.deserialize, [], []

        def arm() -> Any:  # the journal of the moment (a trim replaces it)
            journal = node._SyncObj__raftLog

            def full_at_the_second_entry(command: bytes, index: int, term: int) -> None:
                adds.append(index)
                if len(adds) == 2:  # in memory first, as pysyncobj's FileJournal.add does
                    journal._FileJournal__journal.append((command, index, term))
                    answered.append(True)
                    raise RaftDiskFailure("raft.journal", OSError(errno.ENOSPC, "full"))
                FileJournal.add(journal, command, index, term)

            journal.add = full_at_the_second_entry
            return read()

        serializer.deserialize = arm
        send, sent, stopped = world.send, [], []

        def record(source: str, target: str, message: Any) -> bool:
            if answered and not stopped and source == behind:  # what the seed said then
                sent.append(message)
            return send(source, target, message)

        world.send = record  # type: ignore[method-assign]
        transport = node._SyncObj__transport
        received = transport._onMessageReceived

        def receive(peer: Any, message: Any) -> None:
            try:
                received(peer, message)
            except RaftDiskFailure:
                stopped.append(True)  # a seed stops here (cluster/raft.py)
                raise

        transport._onMessageReceived = receive
        for _ in range(60):
            world.step(0.05)
            if answered:
                break
        assert answered, "the dump was loaded"
        success = [m for m in sent if m.get("type") == "next_node_idx" and m["success"]]
        if node_class is FollowerSafeSyncObj:
            assert stopped and not success
        else:
            assert success and not stopped, "pysyncobj changed its dump loading"
    finally:
        world.close()


LIMIT = 64 * 1024


def past_the_size_limit() -> None:
    """In the seed's process before it runs: files may not grow past 64 KiB (EFBIG)."""
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
    resource.setrlimit(resource.RLIMIT_FSIZE, (LIMIT, LIMIT))


def test_a_seed_whose_journal_cannot_grow_stops_with_one_line(tmp_path: Path) -> None:
    """A real failure in a real seed process: its journal may not grow past 64 KiB
    (``RLIMIT_FSIZE``), so growing it fails in ``ftruncate`` with EFBIG -- as it fails
    with EROFS or EIO on a file system remounted read-only or failing. pysyncobj's
    fallback closed the journal's mapping first: every tick after died on the closed
    file, a traceback ten times a second, and the seed never stopped nor said why."""
    port = listen_port()
    seed_process = subprocess.run(
        [sys.executable, str(Path(__file__).with_name("limited_seed.py")), str(tmp_path),
         str(port)],
        preexec_fn=past_the_size_limit, capture_output=True, text=True, timeout=30,
    )
    assert seed_process.returncode == 0, seed_process.stderr[-3000:]
    outcome = json.loads(seed_process.stdout)
    journal = tmp_path / "raft.journal"
    assert outcome["stopped"] == f"[Errno 27] cannot write {journal} (File too large)", (
        seed_process.stderr[-3000:])
    lines = seed_process.stderr.splitlines()
    assert [line for line in lines if line.startswith(("ERROR", "CRITICAL"))] == [
        line for line in lines if "this seed stops taking part in Raft" in line], lines[-20:]
    assert "Traceback" not in seed_process.stderr
    assert "raise its quota or file-size limit" in seed_process.stderr  # what to do
    assert outcome["acked"] > 0 and outcome["clsn"] > 0
    raft_data_dir.check(str(journal), str(tmp_path / "raft.dump"), f"{journal}{MARKER_SUFFIX}")
    again: list[CommittedBatch] = []
    raft = seed(tmp_path, port, again)
    try:  # no limit now: everything acknowledged is there, and it commits
        wait_for(lambda: raft.snapshot.ready and raft.snapshot.clsn >= outcome["clsn"])
        assert submit(raft, 5) and again[-1].clsn > outcome["clsn"]
    finally:
        raft.close()


class FailingMapping:
    """A journal's mapping on a volume gone bad: its flush fails with EIO."""

    def __init__(self) -> None:
        self.closed = False

    def flush(self) -> None:
        raise OSError(errno.EIO, os.strerror(errno.EIO))

    def close(self) -> None:
        self.closed = True


def test_a_journal_that_cannot_be_flushed_at_the_end_is_closed_with_one_line(
    tmp_path: Path, caplog: pytest.LogCaptureFixture,
) -> None:
    """A seed stopped by an I/O error ends with its journal's last flush failing too:
    pysyncobj's ``_destroy`` raised there (a traceback as the Raft thread ended: 'Exception
    in thread', seen on an ext4 volume shut down under a seed), its file left open."""
    journal = FileJournal(str(tmp_path / "raft.journal"))
    mapping, real = FailingMapping(), journal._FileJournal__journalFile._ResizableFile__mm
    journal._FileJournal__journalFile._ResizableFile__mm = mapping
    journal._destroy()
    real.close()
    assert mapping.closed and journal._FileJournal__journalFile._ResizableFile__f.closed
    assert [r.getMessage() for r in caplog.records] == [
        f"Raft: closing {tmp_path / 'raft.journal'}: [Errno 5] Input/output error"]
    assert "the kernel log says why" in raft_disk.remedy(OSError(errno.EIO, "EIO"))
    assert "open-file limit" in raft_disk.remedy(OSError(errno.EMFILE, "EMFILE"))


def test_a_journal_write_the_file_system_refuses_is_an_error_not_sigbus(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
) -> None:
    """pysyncobj stores its journal's records into a mapping of the file: on a
    copy-on-write file system (btrfs, ZFS) a full disk refuses a page rewritten after a
    sync even though its blocks were allocated, and the store was SIGBUS -- measured on a
    full 120 MB btrfs loop mount: a seed on the code before died with 'Fatal Python
    error: Bus error', status 135, no line; now it stops with its CRITICAL line. The
    records go through ``pwrite``: here the file system's refusal is injected there."""
    path = tmp_path / "raft.journal"
    journal = FileJournal(str(path))
    journal.add(b"\x00first", 1, 1)
    before = path.read_bytes()

    def refused(fd: int, data: Any, offset: int) -> int:
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(os, "pwrite", refused)
    with pytest.raises(RaftDiskFailure, match=r"raft.journal \(No space left on device\)"):
        journal.add(b"\x00second", 2, 1)  # (within the file: no growth, no allocation)
    monkeypatch.undo()
    journal._destroy()
    assert path.read_bytes() == before, "the refused write was not made"


HOLD_BYTES = 256 << 20  # a posix_fallocate this long on tmpfs holds the inode lock 0.1-0.7 s


def test_a_journal_grows_without_keeping_the_other_threads_waiting() -> None:
    """The journal's growth waits in the kernel with the GIL let go (raft_disk.remapped).

    A thread holds the journal's inode lock (a long ``posix_fallocate`` on tmpfs, which
    lets the GIL go); the Raft thread's write grows the journal meanwhile, its
    ``ftruncate`` waiting for that lock, as on a disk whose journal stalls. The main
    thread (the event loop's) goes on: its longest gap is a fraction of the wait.
    Through ``mmap.resize`` (pysyncobj's, and ours before) CPython keeps the GIL in
    ``ftruncate``: the main thread waited as long as the lock was held."""
    raft_disk.install()
    shm = Path("/dev/shm")
    assert shm.is_dir()  # (Linux: tmpfs zeroes what it allocates, holding the lock)
    path = shm / f"raft-growth-{os.getpid()}.journal"
    journal = FileJournal(str(path))
    try:
        resizable = journal._FileJournal__journalFile
        fd = resizable._ResizableFile__f.fileno()
        size = len(resizable._ResizableFile__mm)
        at: dict[str, float] = {}

        def hold() -> None:
            os.posix_fallocate(fd, size, HOLD_BYTES)
            at["held until"] = time.monotonic()

        def grow() -> None:
            time.sleep(0.02)  # (the lock held by then)
            at["grown from"] = time.monotonic()
            resizable.write(size, b"x" * 16)
            at["grown at"] = time.monotonic()

        threads = [threading.Thread(target=hold), threading.Thread(target=grow)]
        for thread in threads:
            thread.start()
        gap, last = 0.0, time.monotonic()
        while any(thread.is_alive() for thread in threads):
            now = time.monotonic()
            gap, last = max(gap, now - last), now
            time.sleep(0.001)
        for thread in threads:
            thread.join()
        assert resizable.read(size, 16) == b"x" * 16
        waited = at["held until"] - at["grown from"]  # the growth's ftruncate, for the lock
        assert at["grown at"] >= at["held until"] and waited > 0.05, at
        assert gap < waited / 2, (gap, waited)
    finally:
        journal._destroy()
        path.unlink()
