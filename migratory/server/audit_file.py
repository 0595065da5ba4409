"""The audit file when several processes append to it and rotate it: the workers of one
server (``Workers = N``, docs/workers.md), each with the same ``AuditLogFile``.

The standard library's ``RotatingFileHandler`` is right for one process only. With N,
each rotated the file on its own: the others went on writing into the file it had just
renamed to ``.1`` (so it was rotated again, early, by each of them) and, once the
renames had moved it past ``AuditLogBackups``, into a deleted file -- events lost from
the middle of the log (3 processes, 300 events, 4 KiB files, 3 backups: 52 of the
newest 109 missing), and fewer kept than the backups hold with 2.

:class:`SharedRotatingFileHandler` writes each event under an exclusive ``flock`` on
``<AuditLogFile>.lock``, first reopening the file if another process rotated it away
(its path names another inode than the one this process has open), so the size it
checks and the file it rotates are everyone's: the processes rotate the one file as one
process would. Locks end with the process: a killed worker holds none.

:class:`AuditFileHandler` (every process's, one or many) says a write that fails -- a
full disk, a file removed from under it -- in one WARNING a minute with the count of
events lost (``audit log <file>: cannot write (...); events lost: ...``), where the standard
handler printed a traceback of some 60 lines on stderr for every event: 22 events on a
full disk (``/dev/full``) made 1,393 lines, and at a publish rate with ``AuditMessage``
the formatting of those tracebacks would be the server's work.
"""

from __future__ import annotations

import contextlib
import fcntl
import logging
import logging.handlers
import os
import sys
import time
from collections.abc import Callable
from typing import Any

log = logging.getLogger("migratory.audit")

LOCK_SUFFIX = ".lock"
ERROR_REPORT_SECONDS = 60.0
"""Failed writes are said at most this often (with the count lost meanwhile)."""


class LostEvents:
    """Events lost, counted; :meth:`lose` says when to tell (at most once a minute)."""

    def __init__(self, clock: Callable[[], float]) -> None:
        self._clock = clock
        self.total = 0
        self._unsaid = 0
        self._said_at: float | None = None

    def lose(self) -> int | None:
        """One more lost; the count since the last telling when it is time to tell."""
        self.total += 1
        self._unsaid += 1
        now = self._clock()
        if self._said_at is not None and now - self._said_at < ERROR_REPORT_SECONDS:
            return None
        self._said_at, unsaid, self._unsaid = now, self._unsaid, 0
        return unsaid


class AuditFileHandler(logging.handlers.RotatingFileHandler):
    """The audit file, rotated; a write that fails is counted (:attr:`lost`) and said
    once a minute, not as a traceback per event."""

    def __init__(
        self,
        filename: str,
        *,
        max_bytes: int,
        backups: int,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        super().__init__(
            filename,
            maxBytes=max_bytes,
            backupCount=backups,
            encoding="utf-8",
            errors="backslashreplace",  # a refused subject's lone surrogate: \ud800
        )
        self.losses = LostEvents(lambda: self._clock())  # (read at each loss)
        self._clock = clock

    def _close_stream(self) -> None:
        """Close the file; the next event opens it anew. What it still held is lost
        (a full disk: the events whose writes failed, counted then). The standard
        handler left a stream whose close failed in place at a rotation: every event
        after it failed, on a closed file, even once the disk had room again."""
        stream, self.stream = self.stream, None
        if stream is not None:
            with contextlib.suppress(OSError):
                stream.close()

    def doRollover(self) -> None:
        self._close_stream()
        super().doRollover()

    def close(self) -> None:
        self.acquire()
        try:
            self._close_stream()
        finally:
            self.release()
        super().close()

    def handleError(self, record: logging.LogRecord) -> None:
        error = sys.exc_info()[1]
        unsaid = self.losses.lose()
        if unsaid is None:
            return
        reason = getattr(error, "strerror", None) or error
        log.warning("audit log %s: cannot write (%s); events lost: %d since the last "
                    "warning, %d in all (said at most once a minute)", self.baseFilename,
                    reason, unsaid, self.lost)

    @property
    def lost(self) -> int:
        """Events whose write failed."""
        return self.losses.total


class SharedRotatingFileHandler(AuditFileHandler):
    """An audit file other processes append to and rotate too."""

    def __init__(
        self,
        filename: str,
        *,
        max_bytes: int,
        backups: int,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._identity: tuple[int, int] | None = None
        super().__init__(filename, max_bytes=max_bytes, backups=backups, clock=clock)
        self._lock_fd: int | None = None
        if os.path.isfile(self.baseFilename):  # not a pipe, /dev/stdout: never rotated
            self._lock_fd = os.open(
                self.baseFilename + LOCK_SUFFIX, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600
            )

    def _open(self) -> Any:
        stream = super()._open()
        info = os.fstat(stream.fileno())
        self._identity = (info.st_dev, info.st_ino)
        return stream

    def _follow(self) -> None:
        """Reopen the file if another process has rotated it since this one opened it."""
        if self.stream is None:
            return
        try:
            info = os.stat(self.baseFilename)
        except FileNotFoundError:
            info = None
        if info is None or (info.st_dev, info.st_ino) != self._identity:
            self._close_stream()
            self.stream = self._open()

    def emit(self, record: logging.LogRecord) -> None:
        if self._lock_fd is None:
            super().emit(record)
            return
        try:
            fcntl.flock(self._lock_fd, fcntl.LOCK_EX)
        except OSError:
            self.handleError(record)
            return
        try:
            self._follow()
            super().emit(record)  # (rotates if this event would pass the size)
        except Exception:
            self.handleError(record)
        finally:
            fcntl.flock(self._lock_fd, fcntl.LOCK_UN)

    def close(self) -> None:
        super().close()
        if self._lock_fd is not None:
            os.close(self._lock_fd)
            self._lock_fd = None
