"""A seed stopped between writing a compaction's dump and trimming its journal.

pysyncobj writes the dump first and trims the journal only once it sees the dump
written. A seed SIGKILLed in between restarts with a dump and a journal that still
starts before it; pysyncobj 0.3.17 then cleared the whole journal, entries after the
dump included (committed ones this seed had acknowledged). Here the crash window is
made permanent by never trimming (so the test is deterministic), then the seed
restarts: every batch must come back.
"""

from __future__ import annotations

import socket
import threading
import time
from pathlib import Path

import pytest

from cluster.coordination import CommittedBatch
from cluster.raft import RaftCoordination, RaftTimings


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def seed(
    data_dir: Path, port: int, committed: list[CommittedBatch], **timings: float
) -> RaftCoordination:
    return RaftCoordination(
        self_address=("127.0.0.1", port),
        seed_addresses=[("127.0.0.1", port)],
        password="x",
        on_commit=committed.append,
        data_dir=data_dir,
        timings=RaftTimings(**timings),  # type: ignore[arg-type]
    )


def commit(raft: RaftCoordination, count: int) -> None:
    for _ in range(count):
        done = threading.Event()
        raft.submit(2, [], lambda clsn, error, unknown, done=done: done.set())
        assert done.wait(10), "Raft did not commit"


def wait_for(predicate, timeout: float = 20) -> None:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.05)


@pytest.mark.parametrize("fixed", [True, False], ids=["ours", "pysyncobj"])
def test_entries_after_the_dump_survive_a_stop_mid_compaction(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, fixed: bool
) -> None:
    port = free_port()
    committed: list[CommittedBatch] = []
    # 1. compact at 50 entries, but never trim the journal: the crash window, for ever
    from pysyncobj import SyncObj

    monkeypatch.setattr(SyncObj, "_SyncObj__deleteEntriesTo", lambda self, to: None)
    raft = seed(tmp_path, port, committed, compaction_entries=50, compaction_seconds=0.2)
    try:
        commit(raft, 120)
        wait_for(lambda: (tmp_path / "raft.dump").exists())
        commit(raft, 60)  # entries after the dump, in the untrimmed journal
    finally:
        raft.close()
    total = committed[-1].clsn
    monkeypatch.undo()
    if not fixed:  # pysyncobj's own start-up: the planted bug this test must catch
        from cluster import raft as raft_module

        monkeypatch.setattr(
            raft_module._SeedSyncObj, "_keep_journal_after_dump", lambda self: None
        )
    # 2. restart on the same directory: the dump, then every entry after it
    again: list[CommittedBatch] = []
    raft = seed(tmp_path, port, again, compaction_entries=100_000, compaction_seconds=3600)
    try:
        wait_for(lambda: raft.snapshot.ready)
        wait_for(lambda: raft.snapshot.clsn >= total or (raft.snapshot.at > 0 and not fixed), 10)
        time.sleep(0.5)
        clsn = raft.snapshot.clsn
    finally:
        raft.close()
    if fixed:
        assert clsn == total, f"restarted at clsn {clsn}, committed {total}: entries lost"
    else:
        assert clsn < total, "pysyncobj changed: it kept the entries after the dump"
