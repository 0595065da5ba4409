"""A seed that cannot load a dump says why it is not ready, once
(cluster/raft_dump_unloadable.py): its own dump at start (a seed started on a dump another
version wrote: a downgrade without ``migratory downgrade-dump``), or its leader's, sent
again and again (10-25 a second)."""

from __future__ import annotations

import gzip
import logging
import pickle
import time
from pathlib import Path

import pytest
from listen_ports import seed_port

from cluster.raft import RaftCoordination, RaftTimings
from cluster.raft_dump_unloadable import LEADERS, OWN, REPEAT, UnloadableDump

PYSYNCOBJ = logging.getLogger("pysyncobj.syncobj")


def failed_load(dump: UnloadableDump, source: str) -> None:
    """What pysyncobj and the follower log of a dump that does not load."""
    with dump.loading(source):
        dump.attempted()
        try:
            raise KeyError("cached")
        except KeyError:
            PYSYNCOBJ.exception("failed to load full dump")
        logging.getLogger("migratory.raft").warning(
            "Raft: the leader's dump could not be loaded: asking for it again")


def test_a_leaders_dump_that_does_not_load_is_said_once_not_at_each_send(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Before: a traceback and a warning at each send, 10 to 25 a second, and the seed's
    readiness said only 'member has not caught up with Raft yet'."""
    caplog.set_level(logging.INFO)
    now = [0.0]
    dump = UnloadableDump(lambda: now[0])
    for _ in range(50):  # a few seconds of the leader's sends
        failed_load(dump, LEADERS)
        now[0] += 0.05
    errors = [r for r in caplog.records if r.levelno >= logging.WARNING]
    assert len(errors) == 1, [r.getMessage() for r in errors]
    assert errors[0].exc_info is not None  # the traceback, once
    assert errors[0].getMessage().startswith(
        "Raft: this seed cannot load the leader's dump (KeyError: 'cached'), sent 1 times in "
        "a row: a leader of another migratory version? Upgrade this seed")
    assert dump.reason is not None and "sent 50 times in a row" in dump.reason
    now[0] += REPEAT
    failed_load(dump, LEADERS)
    said = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
    assert len(said) == 2 and said[1].endswith("(51 failed loads in a row)"), said
    with dump.loading(LEADERS):  # a part of a dump: nothing loaded yet, nothing changes
        pass
    assert dump.reason is not None
    with dump.loading(LEADERS):
        dump.attempted()  # the next one loads
    assert dump.reason is None and dump.failures == 0
    assert caplog.records[-1].getMessage() == (
        "Raft: a dump loaded: this seed applies the log again")


def test_other_lines_pass_through_while_a_dump_loads(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO)
    dump = UnloadableDump(time.monotonic)
    with dump.loading(OWN):
        PYSYNCOBJ.warning("raftCommitIndex (9) exceeds journal end (8) after loading dump")
    assert [r.getMessage() for r in caplog.records] == [
        "raftCommitIndex (9) exceeds journal end (8) after loading dump"]
    assert dump.reason is None
    PYSYNCOBJ.error("failed to load full dump")  # (outside a load: not ours to hold)
    assert len(caplog.records) == 2


def seed(data_dir: Path, port: int) -> RaftCoordination:
    return RaftCoordination(
        self_address=("127.0.0.1", port), seed_addresses=[("127.0.0.1", port)],
        password="x", on_commit=lambda batch: None, data_dir=data_dir,
        timings=RaftTimings(compaction_entries=100_000, compaction_seconds=3600),
    )


def wait_for(predicate, timeout: float = 20) -> None:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.05)


def test_a_seed_started_on_a_dump_it_cannot_load_says_why_it_is_not_ready(
    tmp_path: Path, caplog: pytest.LogCaptureFixture,
) -> None:
    """A dump of another layout (as a later version's would be): before, pysyncobj's
    traceback, and then only 'member has not caught up with Raft yet', for ever."""
    caplog.set_level(logging.INFO)
    port = seed_port()
    raft = seed(tmp_path, port)
    try:
        wait_for(lambda: raft.snapshot.ready)
        raft.syncobj.forceLogCompaction()
        wait_for(lambda: (tmp_path / "raft.dump").exists())
    finally:
        raft.close()
    path = tmp_path / "raft.dump"
    with gzip.open(path, "rb") as f:
        data = pickle.load(f)
    with gzip.open(path, "wb") as f:  # its state as another version might lay it out
        pickle.dump((("a later version's state", *data[0][1:]), *data[1:]), f, protocol=2)
    caplog.clear()
    raft = seed(tmp_path, port)
    try:
        wait_for(lambda: raft.snapshot.at > 0)
        reason = raft.snapshot.dump_unloadable
    finally:
        raft.close()
    assert reason is not None and reason.startswith(
        f"Raft: this seed cannot load its own dump ({path}): AttributeError: "), reason
    assert "migratory downgrade-dump" in reason
    said = [r for r in caplog.records if r.levelno >= logging.WARNING]
    assert [r.getMessage() for r in said] == [reason], [r.getMessage() for r in said]
