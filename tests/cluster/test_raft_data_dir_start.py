"""A seed's ClusterDataDir that cannot hold a Raft log stops the member at start, with
one line naming the key (cluster/raft.py journal_files, run by the start-up check of
cluster/seed.py before the seed waits for the others).

A full disk: creating the empty ``.writable`` file works there, so before the seed
passed the check, waited for a majority of the seeds, and stopped on its first write
('cannot write .../raft.journal.empty-start (No space left on device)', naming a file
and not the key). Tried by hand on a full 64 KiB tmpfs: now 'migratory: ClusterDataDir
/tmp/full/d: No space left on device (0 bytes free; a seed needs 1048576 at least)',
exit 1, at once. Here the free space is what ``shutil.disk_usage`` says (a full
filesystem needs a mount)."""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import pytest

from cluster import raft
from cluster.raft import MIN_FREE_BYTES, journal_files


def usage_with(free: int) -> Any:
    real = shutil.disk_usage

    def disk_usage(path: Any) -> Any:
        total, used, _ = real(path)
        return shutil._ntuple_diskusage(total, used, free)  # type: ignore[attr-defined]

    return disk_usage


@pytest.mark.parametrize("free", [0, MIN_FREE_BYTES - 1])
def test_a_full_disk_is_refused_at_start_naming_the_key(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, free: int
) -> None:
    monkeypatch.setattr(raft.shutil, "disk_usage", usage_with(free))
    with pytest.raises(OSError, match=(
        rf"^\[Errno 28\] ClusterDataDir {tmp_path}/d: No space left on device \({free} "
        rf"bytes free; a seed needs {MIN_FREE_BYTES} at least\)$"
    )):
        journal_files(tmp_path / "d")


def test_room_enough_and_the_files_are_named(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(raft.shutil, "disk_usage", usage_with(MIN_FREE_BYTES))
    assert journal_files(tmp_path / "d") == {
        "journalFile": str(tmp_path / "d" / "raft.journal"),
        "fullDumpFile": str(tmp_path / "d" / "raft.dump"),
    }


def test_a_file_in_place_of_the_directory_is_said_so(tmp_path: Path) -> None:
    """Before: 'ClusterDataDir .../d: File exists' (mkdir's word)."""
    (tmp_path / "d").write_text("")
    with pytest.raises(OSError, match=rf"^\[Errno 20\] ClusterDataDir {tmp_path}/d: not a "
                                      "directory$"):
        journal_files(tmp_path / "d")


def test_a_path_the_kernel_will_not_look_up_is_named_with_the_key(tmp_path: Path) -> None:
    """Before: the look-up (``exists()``) came before the check that names the key, and its
    error went out bare: 'migratory: File name too long'. (By hand, as a user that may not
    search the parent: 'migratory: Permission denied', exit 1, naming nothing.)"""
    data_dir = tmp_path / ("d" * 300) / "raft"
    with pytest.raises(OSError, match=rf"^\[Errno 36\] ClusterDataDir {data_dir}: File name "
                                      "too long$"):
        journal_files(data_dir)


def test_a_directory_this_user_may_not_use_says_what_to_do(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A parent this user may not search (mode 0700 of another user): its look-up fails
    with EACCES. The tests run as root, who may search anything: the refusal is the
    kernel's, planted on this one path."""
    data_dir = tmp_path / "locked" / "raft"
    real_stat = Path.stat

    def stat(path: Path, **kwargs: Any) -> Any:
        if path == data_dir:
            raise PermissionError(13, "Permission denied", str(path))
        return real_stat(path, **kwargs)

    monkeypatch.setattr(Path, "stat", stat)
    with pytest.raises(OSError) as refused:
        journal_files(data_dir)
    assert str(refused.value) == (
        f"[Errno 13] ClusterDataDir {data_dir}: Permission denied (the seed keeps its Raft "
        "files there: give this server's user read and write access to the directory and its "
        "files, and search access to its parents, or set another ClusterDataDir)")
