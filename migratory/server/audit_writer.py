"""The audit file is written by a thread of its own, never by the event loop.

Every audit event (``AuditAccess``, ``AuditMessage``, ``AuditCache``) was written where
it happened, on the event loop: the file handler's ``write`` and ``flush`` (and at a
rotation its ``close``, ``rename`` and ``open``; with ``Workers`` its ``flock``). On a
disk that stalls -- a network volume whose writes wait seconds for the device (a page
under writeback that a write must wait for, dirty-page throttling, an NFS ``close``
that flushes) -- every client of the process waited as long: one write that took 0.3 s
was a 0.3 s gap of the loop (``tests/server/test_audit_writer.py``, measured with the
server's own probe, :mod:`migratory.server.loop_gaps`).

:class:`AuditWriter` is the audit logger's handler: it puts each event (formatted where
it happened: one ``json.dumps``) on a queue of at most :data:`MAX_WAITING_EVENTS` and a
thread hands them, in order, to the file handler (:mod:`migratory.server.audit_file`),
which rotates and counts its own failures as before. It never waits: with the queue
full (the disk far behind) an event is dropped and counted, said in one WARNING a
minute with the count (``audit log <file>: N event(s) dropped: the writes to the file
did not keep up``). :meth:`AuditWriter.close` writes what waits, for at most
:data:`EXIT_FLUSH_SECONDS`.
"""

from __future__ import annotations

import contextlib
import logging
import queue
import threading
import time
from collections.abc import Callable

from migratory.server.audit_file import AuditFileHandler, LostEvents

log = logging.getLogger("migratory.audit")

MAX_WAITING_EVENTS = 10_000
EXIT_FLUSH_SECONDS = 2.0


class AuditWriter(logging.Handler):
    """Hands each event to ``file`` on a thread of its own (started at the first)."""

    def __init__(self, file: AuditFileHandler, *, size: int = MAX_WAITING_EVENTS,
                 clock: Callable[[], float] = time.monotonic) -> None:
        super().__init__()
        self.file = file
        self.events: queue.Queue[logging.LogRecord | None] = queue.Queue(size)
        self.drops = LostEvents(clock)
        self._thread: threading.Thread | None = None

    def emit(self, record: logging.LogRecord) -> None:
        if self._thread is None:
            self._thread = threading.Thread(target=self._write, name="audit-writer",
                                            daemon=True)
            self._thread.start()
        try:
            self.events.put_nowait(record)
        except queue.Full:
            self._drop()

    def _drop(self) -> None:
        unsaid = self.drops.lose()
        if unsaid is not None:
            log.warning("audit log %s: %d event(s) dropped since the last warning, %d in "
                        "all: the writes to the file did not keep up (%d waiting; a slow "
                        "disk?) (said at most once a minute)", self.file.baseFilename,
                        unsaid, self.drops.total, self.events.maxsize)

    @property
    def dropped(self) -> int:
        """Events dropped, the queue full."""
        return self.drops.total

    def _write(self) -> None:
        while True:
            record = self.events.get()
            try:
                if record is None:
                    return
                self.file.handle(record)  # (its failures: counted and said there)
            finally:
                self.events.task_done()

    def flush(self) -> None:
        """Wait until every event queued so far is written (tests; not the loop's)."""
        if self._thread is not None:
            self.events.join()

    def close(self) -> None:
        """Write what waits (at most :data:`EXIT_FLUSH_SECONDS`), close the file."""
        thread, self._thread = self._thread, None
        if thread is not None:
            with contextlib.suppress(queue.Full):
                self.events.put(None, timeout=EXIT_FLUSH_SECONDS)
            thread.join(EXIT_FLUSH_SECONDS)
        self.file.close()
        super().close()
