"""A leader's dump received whole waits beside the seed's own dump: taken, it becomes the
seed's; dropped, the seed's own stays (in a file and in memory). pysyncobj's follower put
it in place of its own at the last part (cluster/raft_dump_received.py;
test_raft_dump_older.py has what that lost)."""

from __future__ import annotations

import gzip
import io
import time
from pathlib import Path
from typing import Any

import pytest
from pysyncobj import pickle as pysyncobj_pickle
from pysyncobj.config import SERIALIZER_STATE
from pysyncobj.serializer import Serializer

from cluster import raft_dump_files
from cluster.raft_dump_files import DumpRetries, stop_on_disk_failures
from cluster.raft_dump_received import (
    RECEIVED_SUFFIX,
    drop_received,
    keep_aside,
    read_received,
    take_received,
)

OWN = ({}, (b"own", 20, 3), (b"own-before", 19, 3), [])
LEADERS = ({}, (b"leader", 10, 2), (b"leader-before", 9, 2), [])
BEHIND = ({}, (b"own", 5, 1), (b"own-before", 4, 1), [])  # a seed behind the leader's


def packed(dump: tuple[object, ...]) -> bytes:
    buffer = io.BytesIO()
    with gzip.GzipFile(fileobj=buffer, mode="wb") as g:
        pysyncobj_pickle.dump(dump, g)
    return buffer.getvalue()


def seed_serializer(tmp_path: Path, in_file: bool) -> Serializer:
    """A seed's serializer holding its own dump :data:`OWN`."""
    path = str(tmp_path / "raft.dump") if in_file else None
    serializer = Serializer(path, 100, False, None, None, None)
    stop_on_disk_failures(serializer, DumpRetries())
    keep_aside(serializer)
    if in_file:
        (tmp_path / "raft.dump").write_bytes(packed(OWN))
    else:
        serializer._Serializer__inMemorySerializedData = packed(OWN)
    return serializer


def receive(serializer: Serializer, dump: tuple[object, ...]) -> None:
    data = packed(dump)
    parts = [data[i:i + 100] for i in range(0, len(data), 100)]
    whole = [serializer.setTransmissionData((part, i == 0, i == len(parts) - 1))
             for i, part in enumerate(parts)]
    assert whole == [False] * (len(parts) - 1) + [True]


@pytest.mark.parametrize("in_file", [True, False], ids=["file", "memory"])
def test_a_dump_received_whole_waits_and_the_own_one_stays_when_dropped(
    tmp_path: Path, in_file: bool,
) -> None:
    serializer = seed_serializer(tmp_path, in_file)
    receive(serializer, LEADERS)
    assert tuple(serializer.deserialize()) == OWN  # (pysyncobj's: before, LEADERS)
    assert tuple(read_received(serializer)) == LEADERS
    drop_received(serializer)
    assert tuple(serializer.deserialize()) == OWN
    assert not (tmp_path / ("raft.dump" + RECEIVED_SUFFIX)).exists()


@pytest.mark.parametrize("in_file", [True, False], ids=["file", "memory"])
def test_a_dump_taken_is_the_seeds_own(tmp_path: Path, in_file: bool) -> None:
    serializer = seed_serializer(tmp_path, in_file)
    receive(serializer, LEADERS)
    take_received(serializer)
    assert tuple(serializer.deserialize()) == LEADERS
    assert not (tmp_path / ("raft.dump" + RECEIVED_SUFFIX)).exists()


def test_a_custom_dump_serializer_is_refused(tmp_path: Path) -> None:
    serializer = Serializer(str(tmp_path / "raft.dump"), 100, False, lambda *a: None,
                            lambda *a: None, None)
    with pytest.raises(ValueError, match="in place of the own dump"):
        keep_aside(serializer)


def test_the_seeds_own_dump_still_being_written_does_not_land_over_a_dump_taken(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A seed forks a writer for its own dump (a compaction) and, before the writer is
    done, takes the leader's dump, newer (it was behind). The writer then renamed its
    older dump over the one taken: raft.dump older than the journal, which restarts
    cleared (the entries after it lost; the data-dir check refuses such a journal).
    Here taking the leader's dump stops the writer first."""
    path = tmp_path / "raft.dump"
    serializer = Serializer(str(path), 100, True, None, None, None)  # (forks its writer)
    stop_on_disk_failures(serializer, DumpRetries())
    keep_aside(serializer)
    write = raft_dump_files.write_dump

    def slowly(*args: Any, **kwargs: Any) -> int:  # (in the writer: the child)
        time.sleep(0.3)
        return write(*args, **kwargs)

    monkeypatch.setattr(raft_dump_files, "write_dump", slowly)
    serializer.serialize(BEHIND, 4)
    assert serializer.checkSerializing()[0] == SERIALIZER_STATE.SERIALIZING
    receive(serializer, LEADERS)
    take_received(serializer)
    time.sleep(0.6)  # past the writer's end, had it run on
    while serializer.checkSerializing()[0] == SERIALIZER_STATE.SERIALIZING:
        time.sleep(0.05)
    assert tuple(serializer.deserialize()) == LEADERS
    # (no trim of the journal for the dump not written: the log is the dump's now)
    assert serializer.checkSerializing()[0] == SERIALIZER_STATE.NOT_SERIALIZING
    assert not (tmp_path / "raft.dump.tmp").exists()
