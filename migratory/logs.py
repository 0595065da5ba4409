"""The server's log lines: readable text (default) or one JSON object per line
(``LogFormat = json``). A line about a client carries ``client``, ``peer`` and
``connection_id`` (the session passes them as ``extra``); in text they are part of the
message itself (``client NAME@ADDRESS #ID``).

A serving process never waits for its log's reader. Written to a pipe or a socket (a
container runtime's log collector, ``migratory serve 2>&1 | head``), each line is
formatted where it is logged and handed to one writer thread (the standard library's
``QueueHandler`` and ``QueueListener``): a ``logging.StreamHandler`` on the event loop
blocked the whole server -- every client, the sequencer, the Raft callbacks -- once a
reader that stopped reading let 64 KiB pile up. To a file or a terminal, which have no
reader to wait for, lines are written at once, in the order of everything else the
process writes there (a test reading the log right after an event finds its line).

Up to :data:`MAX_WAITING_LINES` lines wait for the reader; past them new lines are
dropped and counted, and a WARNING says how many once lines flow again. At exit the
writer gets :data:`EXIT_FLUSH_SECONDS` to write what waits.
"""

from __future__ import annotations

import atexit
import json
import logging
import os
import queue
import stat
import sys
from datetime import UTC, datetime
from logging.handlers import QueueHandler, QueueListener
from typing import TextIO

TEXT_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"
CLIENT_FIELDS = ("client", "peer", "connection_id")
MAX_WAITING_LINES = 10_000
EXIT_FLUSH_SECONDS = 2.0


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


class DroppingQueueHandler(QueueHandler):
    """Formats a record where it is logged and queues the line; never waits: with the
    queue full the line is dropped and counted, and the next line that fits is preceded
    by a WARNING with the count."""

    def __init__(self, lines: queue.Queue[logging.LogRecord | None]) -> None:
        super().__init__(lines)
        self.dropped = 0

    def enqueue(self, record: logging.LogRecord) -> None:
        # (called under the handler's lock: ``dropped`` needs no other)
        if self.dropped and not self._put(self.prepare(self._dropped_record())):
            self.dropped += 1
            return
        self.dropped = 0 if self._put(record) else self.dropped + 1

    def _put(self, record: logging.LogRecord) -> bool:
        try:
            self.queue.put_nowait(record)
        except queue.Full:
            return False
        return True

    def _dropped_record(self) -> logging.LogRecord:
        return logging.LogRecord(
            "migratory.logs", logging.WARNING, __file__, 0,
            "%d log line(s) dropped: the log's reader did not keep up (stderr not read)",
            (self.dropped,), None,
        )


class LogWriter:
    """The writer thread and its queue (one per process)."""

    def __init__(self, stream: TextIO, formatter: logging.Formatter) -> None:
        self.lines: queue.Queue[logging.LogRecord | None] = queue.Queue(MAX_WAITING_LINES)
        self.handler = DroppingQueueHandler(self.lines)
        self.handler.setFormatter(formatter)  # the line as it will be written
        self.stream = stream
        written = logging.StreamHandler(stream)
        written.setFormatter(logging.Formatter("%(message)s"))
        self.listener = QueueListener(self.lines, written)
        self.listener.start()

    def stop(self, timeout: float = EXIT_FLUSH_SECONDS) -> None:
        """Write what waits, for at most ``timeout`` seconds (a reader that never reads
        does not hold the exit; the thread is a daemon)."""
        thread = self.listener._thread
        if thread is None:
            return
        try:
            self.handler.acquire()
            try:
                if self.handler.dropped:  # said before the end, where no line follows
                    warning = self.handler.prepare(self.handler._dropped_record())
                    self.lines.put(warning, timeout=timeout)
                    self.handler.dropped = 0
            finally:
                self.handler.release()
            self.lines.put(None, timeout=timeout)  # (QueueListener's sentinel)
        except queue.Full:
            return
        thread.join(timeout)
        if not thread.is_alive():
            self.listener._thread = None


_writer: LogWriter | None = None


def _stop_writer() -> None:
    if _writer is not None:
        _writer.stop()


def _direct() -> None:
    global _writer
    if _writer is None:
        return
    direct = logging.StreamHandler(_writer.stream)
    direct.setFormatter(_writer.handler.formatter)
    logging.getLogger().handlers[:] = [direct]
    _writer = None


def write_directly() -> None:
    """Write what waits (for at most :data:`EXIT_FLUSH_SECONDS`), then every later line
    at once, on the caller's thread: for a process about to end, whose last words on
    stderr (``migratory: <error>``, a traceback) must come after its log lines."""
    if _writer is not None:
        _writer.stop()
        _direct()


atexit.register(_stop_writer)
os.register_at_fork(after_in_child=_direct)  # the Raft dump writer: no writer thread


def has_a_reader(stream: TextIO) -> bool:
    """Whether ``stream`` is a pipe or a socket: a reader at the other end may stop."""
    try:
        mode = os.fstat(stream.fileno()).st_mode
    except (AttributeError, OSError, ValueError):  # (io.UnsupportedOperation: ValueError)
        return False
    return stat.S_ISFIFO(mode) or stat.S_ISSOCK(mode)


def configure_logging(level: str, log_format: str, stream: TextIO | None = None) -> None:
    """Set up the root logger for a serving process (``LogLevel``, ``LogFormat``): to a
    pipe or a socket through the writer thread, else at once (this module's docstring)."""
    global _writer
    json_lines = log_format == "json"
    formatter = JsonFormatter() if json_lines else logging.Formatter(TEXT_FORMAT)
    if _writer is not None:
        _writer.stop()
        _writer = None
    target = sys.stderr if stream is None else stream
    handler: logging.Handler
    if has_a_reader(target):
        _writer = LogWriter(target, formatter)
        handler = _writer.handler
    else:
        handler = logging.StreamHandler(target)
        handler.setFormatter(formatter)
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level)


def print_line(text: str) -> None:
    """``text`` and its newline on stdout in one write, flushed: the ``listening URL``
    lines tools read. ``print`` writes the newline separately, and with stdout and
    stderr the same pipe (``2>&1``) a log line from the writer thread could land
    between them, splitting the line a reader waits for."""
    sys.stdout.write(text + "\n")
    sys.stdout.flush()
