"""The audit file shared by the workers of one server (``Workers = N``): every worker
appends to ``AuditLogFile`` and rotates it (migratory/server/audit_file.py)."""

from __future__ import annotations

import errno
import json
import multiprocessing
import os
from pathlib import Path
from typing import Any

import pytest

from migratory.config import Config
from migratory.server.audit import Audit
from migratory.server.audit_file import ERROR_REPORT_SECONDS

MAX_BYTES = 4096
BACKUPS = 3


def audits(path: Path, count: int, workers: int) -> list[Audit]:
    """``count`` audit logs on ``path`` as ``count`` processes of a server with
    ``workers`` workers each open it (each its own file and handler)."""
    made = []
    for index in range(count):
        audit = Audit.from_config(Config.from_mapping({
            "AuditLogFile": str(path), "AuditAccess": "true", "Workers": str(workers),
            "AuditLogMaxBytes": str(MAX_BYTES), "AuditLogBackups": str(BACKUPS),
            "ServerName": f"migratory-worker-{index}",
        }))
        assert audit is not None
        made.append(audit)
    return made


def kept(directory: Path) -> list[dict[str, str | int]]:
    """Every event in the audit files, oldest file first; no file past the size."""
    files = sorted(directory.glob("audit.jsonl.[0-9]*"), key=lambda p: -int(p.suffix[1:]))
    files.append(directory / "audit.jsonl")
    events = []
    for file in files:
        assert file.stat().st_size <= MAX_BYTES, file
        events += [json.loads(line)["client"] for line in file.read_text().splitlines()]
    return events


def test_workers_rotating_one_audit_file_keep_what_one_process_keeps(tmp_path: Path) -> None:
    """Three workers' events, interleaved: the newest events kept are the ones a single
    process keeps, none missing. Each rotated the file on its own before: the others
    wrote on into the renamed file, rotated it again early, and at last into a deleted
    one (52 of the newest 109 events missing)."""
    events = 300
    (tmp_path / "one").mkdir()
    (tmp_path / "three").mkdir()
    [single] = audits(tmp_path / "one" / "audit.jsonl", 1, workers=1)
    workers = audits(tmp_path / "three" / "audit.jsonl", 3, workers=3)
    try:
        for number in range(events):
            client = {"name": f"c{number:03d}"}
            single.event("access", "connect", client, outcome="allowed")
            workers[number % 3].event("access", "connect", client, outcome="allowed")
            workers[number % 3].flush()  # (each written by its writer thread: in this order)
    finally:
        for audit in [single, *workers]:
            audit.close()
    alone = [client["name"] for client in kept(tmp_path / "one")]
    shared = [client["name"] for client in kept(tmp_path / "three")]
    assert alone == [f"c{n:03d}" for n in range(events - len(alone), events)]  # the newest
    assert len(alone) > 60
    assert shared == alone


def write_events(path: str, index: int, count: int) -> None:
    [audit] = audits(Path(path), 1, workers=3)
    for number in range(count):
        audit.event("access", "connect", {"name": f"w{index}", "n": number}, outcome="allowed")
    audit.close()


def test_worker_processes_writing_at_once_lose_none_of_their_newest_events(
    tmp_path: Path,
) -> None:
    """Three processes at once (fork): each one's kept events are its newest, in order,
    no line torn, and the files hold what the backups can (each full file within one
    line of the size)."""
    path = tmp_path / "audit.jsonl"
    context = multiprocessing.get_context("fork")
    writers = [context.Process(target=write_events, args=(str(path), index, 200))
               for index in range(3)]
    for writer in writers:
        writer.start()
    for writer in writers:
        writer.join(30)
        assert writer.exitcode == 0
    events = kept(tmp_path)
    for index in range(3):
        numbers = [e["n"] for e in events if e["name"] == f"w{index}"]
        assert numbers == list(range(200 - len(numbers), 200)), f"worker {index}: {numbers}"
    line = max(len(json.dumps(e)) for e in events) + 200  # (the event's other fields)
    for backup in range(1, BACKUPS + 1):
        assert Path(f"{path}.{backup}").stat().st_size > MAX_BYTES - line


def test_an_audit_file_that_is_not_a_regular_file_needs_no_lock(tmp_path: Path) -> None:
    """A FIFO (as /dev/stdout may be) is never rotated: written to as it is, and no lock
    file is made beside it (in /dev, where a server may not create one)."""
    fifo = tmp_path / "audit.jsonl"
    os.mkfifo(fifo)
    reader = os.open(fifo, os.O_RDONLY | os.O_NONBLOCK)
    try:
        [audit] = audits(fifo, 1, workers=2)
        audit.event("access", "connect", {"name": "piped"}, outcome="allowed")
        audit.close()
        assert json.loads(os.read(reader, 65536))["client"] == {"name": "piped"}
    finally:
        os.close(reader)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["audit.jsonl"]


@pytest.mark.parametrize("workers", [1, 2])
def test_a_full_disk_is_said_once_a_minute_not_as_a_traceback_per_event(
    workers: int, caplog: pytest.LogCaptureFixture, capsys: pytest.CaptureFixture[str]
) -> None:
    """Writes that fail (``/dev/full``: ENOSPC) are counted and said in one WARNING a
    minute. Before, each event printed logging's traceback on stderr (some 60 lines)."""
    [audit] = audits(Path("/dev/full"), 1, workers=workers)
    handler = audit.file
    now = [1000.0]
    handler._clock = lambda: now[0]
    try:
        for number in range(50):
            audit.event("access", "connect", {"name": f"c{number}"}, outcome="allowed")
        audit.flush()  # (written by the audit writer's thread)
        now[0] += ERROR_REPORT_SECONDS
        audit.event("access", "connect", {"name": "a minute later"}, outcome="allowed")
    finally:
        audit.close()
    assert "Logging error" not in capsys.readouterr().err
    said = [r.getMessage() for r in caplog.records if r.name == "migratory.audit"]
    assert said == [
        "audit log /dev/full: cannot write (No space left on device); events lost: 1 since "
        "the last warning, 1 in all (said at most once a minute)",
        "audit log /dev/full: cannot write (No space left on device); events lost: 50 since "
        "the last warning, 51 in all (said at most once a minute)",
    ]
    assert handler.lost == 51


class CloseFails:
    """A file whose close fails as on a full disk (after closing it, as Python's files
    do: the flush fails, the descriptor is closed all the same)."""

    def __init__(self, stream: Any) -> None:
        self._stream = stream

    def __getattr__(self, name: str) -> Any:
        return getattr(self._stream, name)

    def close(self) -> None:
        self._stream.close()
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))


@pytest.mark.parametrize("workers", [1, 2])
def test_events_after_a_rotation_whose_close_failed_are_written(
    tmp_path: Path, workers: int
) -> None:
    """The close of the full file at a rotation fails (the disk was full); the disk has
    room again: the next events are written to the new file. Before, the handler kept
    the closed file and every event after it failed ("I/O operation on closed file")."""
    path = tmp_path / "audit.jsonl"
    [audit] = audits(path, 1, workers=workers)
    handler = audit.file
    try:
        audit.event("access", "connect", {"name": "first"}, outcome="allowed")
        audit.flush()  # (written by the audit writer's thread)
        handler.stream = CloseFails(handler.stream)
        number = 0
        while not Path(f"{path}.1").exists():  # up to the rotation (bounded by the size)
            audit.event("access", "connect", {"name": f"c{number}"}, outcome="allowed")
            audit.flush()
            number += 1
            assert number < MAX_BYTES
        for later in range(3):
            audit.event("access", "connect", {"name": f"later{later}"}, outcome="allowed")
    finally:
        audit.close()
    written = [json.loads(line)["client"]["name"] for line in path.read_text().splitlines()]
    assert written[-3:] == ["later0", "later1", "later2"]
