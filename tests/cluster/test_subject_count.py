"""The seeds keep every subject ever published (cluster/subject_count.py): the Raft
status counts them and their retained snapshots, and a WARNING says so as they grow."""

from __future__ import annotations

import logging
from types import SimpleNamespace
from typing import Any

import pytest

from cluster.raft import CoordinationConsumer, _SeedSyncObj
from cluster.raft_dump_unloadable import UnloadableDump
from cluster.raft_dump_untaken import UntakenDumps
from cluster.raft_forward import ForwardHold
from cluster.raft_front_server import FrontStatistics
from cluster.subject_count import SUBJECTS_WARNING, SubjectCountWarning


def test_one_warning_at_the_threshold_then_at_each_doubling() -> None:
    warning = SubjectCountWarning(first=1000)
    told = [n for n in range(0, 10_000, 10) if warning.observe(n, 0) is not None]
    assert told == [1000, 2000, 4000, 8000]
    assert warning.next_at == 16_000


def test_a_count_that_jumps_past_several_thresholds_is_told_once_at_its_value() -> None:
    """A seed restored from a dump of 5,000,000 subjects: one line, not three."""
    warning = SubjectCountWarning()
    line = warning.observe(5 * SUBJECTS_WARNING, 1234)
    assert line is not None and "5,000,000 subjects" in line and "1,234 retained" in line
    assert "migratory_raft_subjects" in line
    assert warning.observe(5 * SUBJECTS_WARNING + 1, 0) is None
    assert warning.next_at == 8 * SUBJECTS_WARNING


def test_the_threshold_is_positive() -> None:
    with pytest.raises(ValueError):
        SubjectCountWarning(first=0)


def seed_with(subjects: int, retained: int) -> Any:
    """The attributes of a seed's SyncObj that ``publish_status`` reads, its consumer
    having numbered ``subjects`` subjects (``retained`` of them with a snapshot)."""
    consumer = CoordinationConsumer(lambda batch: None)
    wire = [("seed-0", i, f"/devices/d{i}/t", b"x", {}, i < retained, True)
            for i in range(subjects)]
    consumer.commit_batch(7, wire, _doApply=True)
    transport = SimpleNamespace(front_statistics=FrontStatistics, listen_error=lambda: None,
                                refused_by=tuple)
    return SimpleNamespace(
        _status_consumer=consumer, _next_digest=0.0, _digest="",
        _subject_warning=SubjectCountWarning(first=3), stopped=None,
        getStatus=lambda: {"state": 0, "has_quorum": False}, _SyncObj__transport=transport,
        isReady=lambda: True, otherNodes=(), isNodeConnected=lambda node: False,
        _unresolved_seeds=lambda now: (), _started=0.0,
        _dump_retries=SimpleNamespace(total=0), forward_hold=ForwardHold(), _entries_taken=0,
        _untaken_dumps=UntakenDumps(
            SimpleNamespace(_SyncObj__raftCurrentTerm=1, _SyncObj__raftMatchIndex={}), lambda: 0.0),
        _unloadable=UnloadableDump(lambda: 0.0),
    )


def test_the_raft_status_counts_subjects_and_snapshots_and_warns(
    caplog: pytest.LogCaptureFixture,
) -> None:
    seed = seed_with(subjects=5, retained=2)
    with caplog.at_level(logging.WARNING, logger="migratory.raft"):
        _SeedSyncObj.publish_status(seed, 1.0)
        _SeedSyncObj.publish_status(seed, 2.0)
    status = seed.status_snapshot
    assert (status.subjects, status.snapshots) == (5, 2)
    lines = [r.getMessage() for r in caplog.records]
    assert len(lines) == 1 and "hold 5 subjects (2 retained snapshots)" in lines[0]
