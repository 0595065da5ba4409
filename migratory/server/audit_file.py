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
"""

from __future__ import annotations

import fcntl
import logging
import logging.handlers
import os
from typing import Any

LOCK_SUFFIX = ".lock"


class SharedRotatingFileHandler(logging.handlers.RotatingFileHandler):
    """A ``RotatingFileHandler`` for a file other processes append to and rotate too."""

    def __init__(self, filename: str, *, max_bytes: int, backups: int) -> None:
        self._identity: tuple[int, int] | None = None
        super().__init__(
            filename,
            maxBytes=max_bytes,
            backupCount=backups,
            encoding="utf-8",
            errors="backslashreplace",  # a refused subject's lone surrogate: \ud800
        )
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
            self.stream.close()
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
