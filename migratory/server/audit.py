"""The audit log: access, message and cache events as JSON lines, one key per category.

Off by default (``AuditAccess``, ``AuditMessage``, ``AuditCache``); the events go to
``AuditLogFile`` through the standard library's ``RotatingFileHandler`` (rotated at
``AuditLogMaxBytes``, ``AuditLogBackups`` files kept; with ``Workers`` > 1 every worker
appends to the one file and they rotate it as one: :mod:`migratory.server.audit_file`),
written by a thread of its own, never by the event loop
(:mod:`migratory.server.audit_writer`).
One event is one JSON object on one line::

    {"time": "2026-11-23T19:04:05.123456Z", "server": "migratory", "category": "access",
     "event": "connect", "client": {"name": "app-1", "peer": "127.0.0.1:50312",
     "connection_id": 7}, "outcome": "allowed"}

docs/monitoring.md lists every event and its fields. Callers check the category's flag
first (``if audit.message: ...``) so a category that is off costs one attribute read.
"""

from __future__ import annotations

import json
import logging
from datetime import UTC, datetime
from typing import Any

from migratory.config import Config
from migratory.server.audit_file import AuditFileHandler, SharedRotatingFileHandler
from migratory.server.audit_writer import AuditWriter


class Audit:
    """Writes audit events of the categories that are on."""

    def __init__(
        self, logger: logging.Logger, *, server: str, access: bool, message: bool, cache: bool
    ) -> None:
        self._logger = logger
        self._server = server
        self.access = access
        self.message = message
        self.cache = cache

    @classmethod
    def from_config(cls, config: Config) -> Audit | None:
        """The audit log ``config`` asks for; None when every category is off."""
        if not (config.audit_access or config.audit_message or config.audit_cache):
            return None
        try:
            handler: AuditFileHandler
            if config.workers > 1:  # every worker appends to the file and rotates it
                handler = SharedRotatingFileHandler(
                    config.audit_log_file,
                    max_bytes=config.audit_log_max_bytes,
                    backups=config.audit_log_backups,
                )
            else:
                handler = AuditFileHandler(
                    config.audit_log_file,
                    max_bytes=config.audit_log_max_bytes,
                    backups=config.audit_log_backups,
                )
        except OSError as exc:  # (its own text names neither the file nor the key)
            raise OSError(exc.errno, f"AuditLogFile {config.audit_log_file}: "
                          f"{exc.strerror or exc}") from None
        handler.setFormatter(logging.Formatter("%(message)s"))
        logger = logging.getLogger(f"migratory.audit.{id(handler):x}")
        logger.handlers[:] = [AuditWriter(handler)]
        logger.setLevel(logging.INFO)
        logger.propagate = False  # audit lines never mix with the server's log
        return cls(
            logger,
            server=config.server_name,
            access=config.audit_access,
            message=config.audit_message,
            cache=config.audit_cache,
        )

    def event(
        self, category: str, event: str, client: dict[str, Any] | None = None, **fields: Any
    ) -> None:
        record: dict[str, Any] = {
            "time": datetime.now(UTC).isoformat(timespec="microseconds").replace("+00:00", "Z"),
            "server": self._server,
            "category": category,
            "event": event,
        }
        if client is not None:
            record["client"] = client
        record.update(fields)
        self._logger.info(json.dumps(record, default=str, ensure_ascii=False))

    @property
    def file(self) -> AuditFileHandler:
        """The file's handler (behind the writer thread's queue)."""
        [writer] = self._logger.handlers
        assert isinstance(writer, AuditWriter)
        return writer.file

    def flush(self) -> None:
        """Wait until every event so far is written (tests: never on the event loop)."""
        for handler in self._logger.handlers:
            handler.flush()

    def close(self) -> None:
        for handler in list(self._logger.handlers):
            handler.close()
            self._logger.removeHandler(handler)
