"""The audit file is written off the event loop (migratory/server/audit_writer.py)."""

from __future__ import annotations

import json
import logging
import threading
import time
from pathlib import Path
from typing import Any

import pytest
import trio

from migratory.config import Config
from migratory.server import loop_gaps
from migratory.server.audit import Audit
from migratory.server.audit_file import AuditFileHandler
from migratory.server.audit_writer import AuditWriter

SLOW_WRITE = 0.5  # seconds a write of the audit file waits for the device


class SlowWrites:
    """The audit file on a disk that stalls: each write waits ``delay`` (time.sleep, as
    a write waiting for the device holds its thread), or until ``gate`` is set."""

    def __init__(self, stream: Any, delay: float = 0.0,
                 gate: threading.Event | None = None) -> None:
        self._stream = stream
        self._delay = delay
        self._gate = gate
        self.writes = 0

    def __getattr__(self, name: str) -> Any:
        return getattr(self._stream, name)

    def write(self, text: str) -> int:
        if self._gate is not None:
            self._gate.wait(10)
        time.sleep(self._delay)
        self.writes += 1
        written: int = self._stream.write(text)
        return written


def audit_to(path: Path) -> Audit:
    audit = Audit.from_config(Config.from_mapping({
        "AuditLogFile": str(path), "AuditAccess": "true",
    }))
    assert audit is not None
    return audit


def names(path: Path) -> list[str]:
    return [json.loads(line)["client"]["name"] for line in path.read_text().splitlines()]


def test_a_slow_audit_file_does_not_stall_the_event_loop(tmp_path: Path) -> None:
    """Five events whose writes take 0.5 s each, logged on the loop 10 ms apart: the
    loop's longest gap (the server's own probe) stays far below one write. Before, each
    write was on the loop: a gap of 0.5 s or more, every client of the process waiting."""
    path = tmp_path / "audit.jsonl"
    audit = audit_to(path)
    slow = SlowWrites(audit.file.stream, delay=SLOW_WRITE)
    audit.file.stream = slow
    gaps = loop_gaps.LoopGaps()

    async def main() -> None:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(loop_gaps.probe, gaps)
            await trio.sleep(0.05)
            for number in range(5):
                audit.event("access", "connect", {"name": f"c{number}"}, outcome="allowed")
                await trio.sleep(0.01)
            await trio.to_thread.run_sync(audit.flush)
            nursery.cancel_scope.cancel()

    try:
        trio.run(main)
    finally:
        audit.close()
    assert slow.writes >= 5
    assert names(path) == [f"c{number}" for number in range(5)]
    print("longest loop gap", gaps.max_ms)
    assert gaps.max_ms < SLOW_WRITE * 1000 * 0.8, gaps.statistics()


def test_events_past_the_queue_are_dropped_and_said_once_a_minute(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """The file stuck (a write waits): the queue holds 3 events, the next are dropped,
    counted, said once; once the disk moves, what was queued is written, in order."""
    path = tmp_path / "audit.jsonl"
    file = AuditFileHandler(str(path), max_bytes=1 << 20, backups=1)
    gate = threading.Event()
    file.stream = SlowWrites(file.stream, gate=gate)
    now = [1000.0]
    writer = AuditWriter(file, size=3, clock=lambda: now[0])
    audit = Audit(_logger_with(writer), server="s", access=True, message=False, cache=False)
    try:
        for number in range(10):
            audit.event("access", "connect", {"name": f"c{number}"}, outcome="allowed")
            time.sleep(0.01)  # (the writer takes c0 and waits in its write)
        gate.set()
        audit.flush()
    finally:
        audit.close()
    written = names(path)
    assert written == [f"c{number}" for number in range(len(written))]
    assert 3 <= len(written) <= 4 and writer.dropped == 10 - len(written)
    said = [r.getMessage() for r in caplog.records if r.name == "migratory.audit"]
    assert len(said) == 1 and "1 event(s) dropped since the last warning, 1 in all" in said[0]


def _logger_with(handler: AuditWriter) -> logging.Logger:
    logger = logging.getLogger(f"migratory.audit.test.{id(handler):x}")
    logger.handlers[:] = [handler]
    logger.setLevel(logging.INFO)
    logger.propagate = False
    return logger
