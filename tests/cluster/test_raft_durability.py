"""cluster/raft_durability.py on real files: what it syncs, and a disk that fails."""

from __future__ import annotations

import errno
import os
from pathlib import Path

import pytest
from pysyncobj.journal import FileJournal, MetaStorer

from cluster import raft_durability
from cluster.raft_disk import RaftDiskFailure
from cluster.raft_follower import FollowerSafeSyncObj  # noqa: F401  (installs the patches)


@pytest.fixture
def syncs(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    calls: list[str] = []
    real_file, real_directory = raft_durability.sync_file, raft_durability.sync_directory

    def sync_file(fd: int) -> None:
        calls.append(f"file {os.path.basename(os.readlink(f'/proc/self/fd/{fd}'))}")
        real_file(fd)

    def sync_directory(path: str) -> None:
        calls.append(f"directory {os.path.basename(path)}")
        real_directory(path)

    monkeypatch.setattr(raft_durability, "sync_file", sync_file)
    monkeypatch.setattr(raft_durability, "sync_directory", sync_directory)
    raft_durability.install()
    return calls


def test_a_journal_is_synced_once_per_batch_of_writes(tmp_path: Path, syncs: list[str]) -> None:
    journal = FileJournal(str(tmp_path / "raft.journal"))
    assert syncs == ["file raft.journal", f"directory {tmp_path.name}"]  # created, named
    syncs.clear()
    raft_durability.journal_durable(journal)
    assert syncs == []  # nothing written since
    journal.add(b"a", 1, 1)
    journal.add(b"b", 2, 1)
    raft_durability.journal_durable(journal)
    raft_durability.journal_durable(journal)
    assert syncs == ["file raft.journal"]
    journal._destroy()


def test_the_term_and_vote_are_synced_before_they_replace_the_old_ones(
    tmp_path: Path, syncs: list[str]
) -> None:
    storer = MetaStorer(str(tmp_path / "raft.journal.meta"))
    storer.storeMeta({"currentTerm": 7, "votedForNodeId": "127.0.0.1:2"})
    assert syncs == ["file raft.journal.meta.tmp", f"directory {tmp_path.name}"]
    assert storer.getMeta() == {"currentTerm": 7, "votedForNodeId": "127.0.0.1:2"}
    assert not (tmp_path / "raft.journal.meta.tmp").exists()


def test_a_dump_is_synced_before_it_is_renamed_into_place(
    tmp_path: Path, syncs: list[str]
) -> None:
    from pysyncobj import serializer

    (tmp_path / "raft.dump.tmp").write_bytes(b"state")
    serializer.atomicReplace(str(tmp_path / "raft.dump.tmp"), str(tmp_path / "raft.dump"))
    assert syncs == ["file raft.dump.tmp", f"directory {tmp_path.name}"]
    assert (tmp_path / "raft.dump").read_bytes() == b"state"


def test_a_sync_that_fails_stops_the_seed_naming_the_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    raft_durability.install()
    journal = FileJournal(str(tmp_path / "raft.journal"))
    journal.add(b"a", 1, 1)

    def failing(fd: int) -> None:
        raise OSError(errno.EIO, "Input/output error")

    monkeypatch.setattr(raft_durability, "sync_file", failing)
    with pytest.raises(RaftDiskFailure, match=r"raft\.journal"):
        raft_durability.journal_durable(journal)
    with pytest.raises(RaftDiskFailure, match=r"raft\.journal\.meta"):
        MetaStorer(str(tmp_path / "raft.journal.meta")).storeMeta({"currentTerm": 1})
    journal._destroy()


@pytest.mark.parametrize("code", [errno.EINVAL, errno.EOPNOTSUPP])
def test_a_file_system_that_cannot_sync_a_directory_is_let_be(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, code: int
) -> None:
    real_fsync = os.fsync

    def fsync(fd: int) -> None:
        if os.path.isdir(f"/proc/self/fd/{fd}"):
            raise OSError(code, os.strerror(code))
        real_fsync(fd)

    monkeypatch.setattr(raft_durability.os, "fsync", fsync)
    raft_durability.sync_directory(str(tmp_path))  # no error
    monkeypatch.setattr(raft_durability.os, "fsync", lambda fd: (_ for _ in ()).throw(
        OSError(errno.EIO, "Input/output error")))
    with pytest.raises(OSError, match="Input/output"):
        raft_durability.sync_directory(str(tmp_path))
