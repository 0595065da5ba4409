"""The server's log lines: readable text (default) or one JSON object per line
(``LogFormat = json``). A line about a client carries ``client``, ``peer`` and
``connection_id`` (the session passes them as ``extra``); in text they are part of the
message itself (``client NAME@ADDRESS #ID``).

A serving process never waits long for its log. Each line is formatted where it is
logged and handed to one writer thread (the standard library's ``QueueHandler`` and
``QueueListener``): a ``logging.StreamHandler`` on the event loop blocked the whole
server -- every client, the sequencer, the Raft callbacks -- once a pipe's reader that
stopped reading let 64 KiB pile up, or a terminal nobody read (stopped with Ctrl-S, a
stalled ssh session) let ~16 KiB: a member whose terminal was not read for 4 s kept its
event loop from running for 5.0 s. To a pipe or a socket (a container runtime's log
collector, ``migratory serve 2>&1 | head``) the call never waits. To a file or a
terminal the call waits until its line is written, as a direct write would -- in the
order of everything else the process writes there, and a test reading the log right
after an event finds its line -- but for at most :data:`WRITE_WAIT_SECONDS`, and only
while the writer keeps up: a write that takes longer (a disk that stalls, a terminal
stopped) holds the event loop once, that long, and later lines wait in the queue
until it is written.

Up to :data:`MAX_WAITING_LINES` lines wait; past them new lines are dropped and counted
(:func:`lines_dropped`, ``migratory_log_lines_dropped_total``), and a WARNING says how
many once lines flow again. At exit the writer gets :data:`EXIT_FLUSH_SECONDS` to write
what waits.
"""

from __future__ import annotations

import atexit
import json
import logging
import os
import queue
import stat
import sys
import threading
from datetime import UTC, datetime
from logging.handlers import QueueHandler, QueueListener
from typing import TextIO

TEXT_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"
CLIENT_FIELDS = ("client", "peer", "connection_id")
MAX_WAITING_LINES = 10_000
EXIT_FLUSH_SECONDS = 2.0
WRITE_WAIT_SECONDS = 0.1
"""To a file or a terminal, how long a logging call waits for its line to be written."""


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
    """Formats a record where it is logged and queues the line; never waits for room:
    with the queue full the line is dropped and counted, and the next line that fits is
    preceded by a WARNING with the count. With ``wait``, waits that long at most for the
    line to be written, if the writer had written every line before it."""

    def __init__(self, lines: queue.Queue[logging.LogRecord | None],
                 written: WrittenLines | None = None, wait: float = 0.0) -> None:
        super().__init__(lines)
        self.dropped = 0  # since the last line that fitted (said in the WARNING)
        self.dropped_total = 0
        self.queued = 0
        self.written = written
        self.wait = wait

    def enqueue(self, record: logging.LogRecord) -> None:
        # (called under the handler's lock: ``dropped`` and ``queued`` need no other)
        if self.dropped and not self._put(self.prepare(self._dropped_record())):
            self._drop()
            return
        caught_up = self.written is not None and self.written.count == self.queued
        if not self._put(record):
            self._drop()
            return
        self.dropped = 0
        if caught_up and self.wait > 0 and self.written is not None:
            self.written.wait_for(self.queued, self.wait)

    def _drop(self) -> None:
        self.dropped += 1
        self.dropped_total += 1

    def _put(self, record: logging.LogRecord) -> bool:
        try:
            self.queue.put_nowait(record)
        except queue.Full:
            return False
        self.queued += 1
        return True

    def _dropped_record(self) -> logging.LogRecord:
        return logging.LogRecord(
            "migratory.logs", logging.WARNING, __file__, 0,
            "%d log line(s) dropped: the log's reader did not keep up (stderr not read)",
            (self.dropped,), None,
        )


class WrittenLines(logging.StreamHandler):  # type: ignore[type-arg]
    """The writer thread's handler: writes each line and counts it."""

    def __init__(self, stream: TextIO) -> None:
        super().__init__(stream)
        self.setFormatter(logging.Formatter("%(message)s"))
        self.count = 0
        self._written = threading.Condition()

    def emit(self, record: logging.LogRecord) -> None:
        super().emit(record)
        with self._written:
            self.count += 1
            self._written.notify_all()

    def wait_for(self, count: int, timeout: float) -> None:
        """Until ``count`` lines are written, or ``timeout`` seconds."""
        with self._written:
            self._written.wait_for(lambda: self.count >= count, timeout)


class LogWriter:
    """The writer thread and its queue (one per process)."""

    def __init__(self, stream: TextIO, formatter: logging.Formatter,
                 wait: float = 0.0) -> None:
        self.lines: queue.Queue[logging.LogRecord | None] = queue.Queue(MAX_WAITING_LINES)
        written = WrittenLines(stream)
        self.handler = DroppingQueueHandler(self.lines, written, wait)
        self.handler.setFormatter(formatter)  # the line as it will be written
        self.stream = stream
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
                    self.handler.queued += 1
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
_dropped_before = 0  # by the writers this process had before its present one


def lines_dropped() -> int:
    """Log lines this process dropped since it started (its log's reader was behind by
    :data:`MAX_WAITING_LINES` lines)."""
    return _dropped_before + (0 if _writer is None else _writer.handler.dropped_total)


def _forget_writer() -> None:
    global _writer, _dropped_before
    if _writer is not None:
        _dropped_before += _writer.handler.dropped_total
        _writer = None


def _stop_writer() -> None:
    if _writer is not None:
        _writer.stop()


def _direct() -> None:
    if _writer is None:
        return
    direct = logging.StreamHandler(_writer.stream)
    direct.setFormatter(_writer.handler.formatter)
    logging.getLogger().handlers[:] = [direct]
    _forget_writer()


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
    """Set up the root logger for a serving process (``LogLevel``, ``LogFormat``): every
    line through the writer thread, waited for to a file or a terminal (this module's
    docstring)."""
    global _writer
    json_lines = log_format == "json"
    formatter = JsonFormatter() if json_lines else logging.Formatter(TEXT_FORMAT)
    if _writer is not None:
        _writer.stop()
        _forget_writer()
    target = sys.stderr if stream is None else stream
    wait = 0.0 if has_a_reader(target) else WRITE_WAIT_SECONDS
    _writer = LogWriter(target, formatter, wait)
    root = logging.getLogger()
    root.handlers[:] = [_writer.handler]
    root.setLevel(level)


def print_line(text: str) -> None:
    """``text`` and its newline on stdout in one write, flushed: the ``listening URL``
    lines tools read. ``print`` writes the newline separately, and with stdout and
    stderr the same pipe (``2>&1``) a log line from the writer thread could land
    between them, splitting the line a reader waits for."""
    sys.stdout.write(text + "\n")
    sys.stdout.flush()
