"""The leader's dump rewritten for 524f73f (``cluster/raft_dump_old_format.py``): made in
a thread once per dump, what 524f73f loads, never retried for a dump that fails, and
not kept past a start. The leader sending it: ``test_cluster_mixed_versions.py``."""

from __future__ import annotations

import logging
import os
import time
from pathlib import Path
from typing import IO

import pytest
from test_dump_downgrade import cache_state, old_dump, written
from test_raft_dump_protocol import seed_state

from cluster.raft_dump_old_format import SUFFIX, OldFormatDump


def opened(copies: OldFormatDump) -> IO[bytes]:
    """The copy, once its thread has made it (bounded: 200 tries)."""
    for _ in range(200):
        copy = copies.open()
        if copy is not None:
            return copy
        time.sleep(0.05)
    raise AssertionError("no copy made")


def test_the_copy_is_what_524f73f_loads_and_is_made_again_for_a_new_dump(
    tmp_path: Path,
) -> None:
    dump = tmp_path / "raft.dump"
    written(dump, seed_state(300))
    before = dump.read_bytes()
    copies = OldFormatDump(str(dump))
    with opened(copies) as copy:
        assert set(cache_state(copy.read())) == set(cache_state(old_dump()))
    assert dump.read_bytes() == before  # the dump itself as it was
    with opened(copies):
        assert copies.made == 1  # the same dump: the same copy
    written(dump, seed_state(400))  # a new dump (replaced whole, as a seed does)
    os.utime(dump, ns=(1, 1))  # (a new mtime whatever the clock's resolution)
    with opened(copies):
        assert copies.made == 2


def test_a_dump_that_cannot_be_rewritten_is_tried_once(
    tmp_path: Path, caplog: pytest.LogCaptureFixture,
) -> None:
    dump = tmp_path / "raft.dump"
    dump.write_bytes(b"not a dump")
    copies = OldFormatDump(str(dump))
    with caplog.at_level(logging.ERROR, logger="migratory.raft"):
        for _ in range(20):
            assert copies.open() is None
            time.sleep(0.05)
    failures = [r for r in caplog.records if "could not be rewritten" in r.getMessage()]
    assert len(failures) == 1, failures
    assert not (tmp_path / f"raft.dump{SUFFIX}").exists()
    assert not (tmp_path / f"raft.dump{SUFFIX}.tmp").exists()


def test_a_copy_made_before_a_start_is_removed(tmp_path: Path) -> None:
    dump = tmp_path / "raft.dump"
    written(dump, seed_state(300))
    for name in (f"raft.dump{SUFFIX}", f"raft.dump{SUFFIX}.tmp",
                 f"raft.dump{SUFFIX}.tmp.downgrade.tmp"):
        (tmp_path / name).write_bytes(b"an old copy")
    OldFormatDump(str(dump))
    assert sorted(p.name for p in tmp_path.iterdir()) == ["raft.dump"]
