"""The server's log lines: readable text (default) or one JSON object per line
(``LogFormat = json``). A line about a client carries ``client``, ``peer`` and
``connection_id`` (the session passes them as ``extra``); in text they are part of the
message itself (``client NAME@ADDRESS #ID``)."""

from __future__ import annotations

import json
import logging
import sys
from datetime import UTC, datetime
from typing import TextIO

TEXT_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"
CLIENT_FIELDS = ("client", "peer", "connection_id")


class JsonFormatter(logging.Formatter):
    """``{"time", "level", "logger", "message"[, "client", "peer", "connection_id"]
    [, "exception"]}`` on one line."""

    def format(self, record: logging.LogRecord) -> str:
        line: dict[str, object] = {
            "time": datetime.fromtimestamp(record.created, UTC)
            .isoformat(timespec="milliseconds")
            .replace("+00:00", "Z"),
            "level": record.levelname,
            "logger": record.name,
            "message": record.getMessage(),
        }
        for name in CLIENT_FIELDS:
            if hasattr(record, name):
                line[name] = getattr(record, name)
        if record.exc_info:
            line["exception"] = self.formatException(record.exc_info)
        return json.dumps(line, default=str, ensure_ascii=False)


def configure_logging(level: str, log_format: str, stream: TextIO | None = None) -> None:
    """Set up the root logger for a serving process (``LogLevel``, ``LogFormat``)."""
    handler = logging.StreamHandler(sys.stderr if stream is None else stream)
    json_lines = log_format == "json"
    handler.setFormatter(JsonFormatter() if json_lines else logging.Formatter(TEXT_FORMAT))
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level)
