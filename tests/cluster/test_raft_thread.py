"""pysyncobj's tick thread and the thread that builds it.

A seed builds its Raft node in a trio worker thread (loading a long journal must not
block the event loop). pysyncobj 0.3.17's tick thread stops, silently, as soon as the
thread that built the ``SyncObj`` ends -- and trio ends idle worker threads after
about 10 s: Raft then stops committing for good (seen as every publish stalling ~10 s
after start). These tests pin pysyncobj's behaviour (so a new version that changes it
shows up here) and show that :class:`cluster.raft.RaftCoordination` keeps ticking.
"""

from __future__ import annotations

import threading
import time
from pathlib import Path

from listen_ports import seed_port
from pysyncobj import SyncObj, SyncObjConf
from test_raft_dump_restart import commit, seed

from cluster.coordination import CommittedBatch
from cluster.raft import RaftCoordination


def free_port() -> int:
    return seed_port()  # it and its Raft port below the ephemeral range: listen_ports.py


def built_in_a_thread(build):  # type: ignore[no-untyped-def]
    """``build()`` run in a thread that then ends; returns what it built."""
    box = []
    thread = threading.Thread(target=lambda: box.append(build()))
    thread.start()
    thread.join()
    return box[0]


def tick_thread_alive(syncobj: SyncObj) -> bool:
    thread = syncobj._SyncObj__thread
    return bool(thread is not None and thread.is_alive())


def test_pysyncobj_stops_ticking_when_its_building_thread_ends() -> None:
    port = free_port()
    syncobj = built_in_a_thread(
        lambda: SyncObj(f"127.0.0.1:{port}", [], conf=SyncObjConf(password="x"))
    )
    try:
        deadline = time.monotonic() + 5
        while tick_thread_alive(syncobj) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not tick_thread_alive(syncobj), "pysyncobj changed: revisit cluster/raft.py"
    finally:
        syncobj.destroy()


def test_raft_coordination_keeps_ticking_after_its_building_thread_ends() -> None:
    port = free_port()
    committed = []
    raft = built_in_a_thread(
        lambda: RaftCoordination(
            self_address=("127.0.0.1", port),
            seed_addresses=[("127.0.0.1", port)],
            password="x",
            on_commit=committed.append,
        )
    )
    try:
        time.sleep(1.0)  # the building thread is long gone
        assert tick_thread_alive(raft.syncobj)
        done = threading.Event()
        raft.submit(2, [], lambda clsn, error, unknown: done.set())
        assert done.wait(10), "Raft stopped committing"
        assert committed and committed[-1].clsn == 1
        deadline = time.monotonic() + 5  # the Raft thread publishes its status every 50 ms
        while raft.snapshot.clsn < 1 and time.monotonic() < deadline:
            time.sleep(0.02)
        snapshot = raft.snapshot
        assert snapshot.clsn == 1 and snapshot.ready and snapshot.state == "leader", snapshot
    finally:
        raft.close()


def test_a_submit_after_close_is_refused_not_raised() -> None:
    """A member whose Raft node stopped (its disk full) closes it while its cluster links
    still hand in a non-seed's forwards: those were an ``AttributeError`` out of
    pysyncobj that killed the link's task (CI, 865e0e6). Now each is answered, definite."""
    port = free_port()
    raft = RaftCoordination(
        self_address=("127.0.0.1", port), seed_addresses=[("127.0.0.1", port)],
        password="x", on_commit=lambda _batch: None,
    )
    raft.close()
    outcome: list[tuple[object, ...]] = []
    raft.submit(2, [], lambda clsn, error, unknown: outcome.append((clsn, error, unknown)))
    raft.submit(2, [], lambda *a: outcome.append(a), send_by=time.monotonic() + 5)
    assert outcome == [(None, "RAFT_STOPPED", False)] * 2


def test_a_submit_to_a_stopped_raft_node_is_refused_at_once() -> None:
    """A node stopped by its disk (cluster/raft_disk.py) handles no command again, and
    the member closes it only after it noticed (up to 0.1 s later): a command queued
    meanwhile was never answered, its non-seed's link held until the member was gone."""
    port = free_port()
    raft = RaftCoordination(
        self_address=("127.0.0.1", port), seed_addresses=[("127.0.0.1", port)],
        password="x", on_commit=lambda _batch: None,
    )
    try:
        raft.syncobj.stopped = "cannot write raft.journal (No space left on device)"
        outcome: list[tuple[object, ...]] = []
        raft.submit(2, [], lambda *a: outcome.append(a))
        assert outcome == [(None, "RAFT_STOPPED", False)]
    finally:
        raft.close()


REPLAYED = 300
"""Commands in the journal the restarted node replays (each applied in ~5 ms here)."""


def test_a_node_closed_while_it_replays_its_journal_applies_no_more(tmp_path: Path) -> None:
    """pysyncobj applies every committed entry in one tick, and ``close`` waits for the
    tick: a seed stopped (SIGTERM) while it replayed a long journal at start-up applied
    all of it first -- 2.4-4.8 s of exit for a journal of 140,000 messages. Now the
    entries left stay unapplied: counted, not timed (before: all ``REPLAYED``)."""
    port = free_port()
    committed: list[CommittedBatch] = []
    raft = seed(tmp_path, port, committed)
    try:
        commit(raft, REPLAYED)
    finally:
        raft.close()
    replaying = threading.Event()
    again: list[CommittedBatch] = []

    def applied_slowly(batch: CommittedBatch) -> None:  # (a hub that takes its time)
        again.append(batch)
        replaying.set()
        time.sleep(0.005)

    raft = RaftCoordination(
        self_address=("127.0.0.1", port), seed_addresses=[("127.0.0.1", port)],
        password="x", on_commit=applied_slowly, data_dir=tmp_path,
    )
    try:
        assert replaying.wait(20), "the journal was not replayed"
    finally:
        raft.close()
    closed_at = len(again)
    time.sleep(0.05)
    assert len(again) == closed_at  # nothing after close
    assert 0 < closed_at < REPLAYED // 2, closed_at
    status = raft.syncobj.getStatus()
    assert status["last_applied"] < status["commit_idx"]  # what Raft counts: the same
