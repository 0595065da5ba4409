"""The server's log lines (migratory/logs.py): written by a thread, never waited for."""

from __future__ import annotations

import io
import json
import logging
import os
import threading
from collections.abc import Iterator

import pytest

from migratory import logs

LINE = "x" * 100


@pytest.fixture
def restore_root() -> Iterator[None]:
    root = logging.getLogger()
    handlers, level = root.handlers[:], root.level
    yield
    if logs._writer is not None:
        logs._writer.stop()
        logs._writer = None
    root.handlers[:] = handlers
    root.setLevel(level)


def drain(fd: int, into: bytearray) -> None:
    while chunk := os.read(fd, 65536):
        into += chunk


def test_a_reader_that_stops_reading_does_not_stop_the_server(restore_root: None) -> None:
    """30,000 lines into a pipe nobody reads (64 KiB hold ~600 of them): every logging
    call returns; what did not fit is dropped and counted, and said once lines flow."""
    read_end, write_end = os.pipe()
    stream = os.fdopen(write_end, "w")
    logs.configure_logging("INFO", "text", stream)
    log = logging.getLogger("migratory.test")
    calls = threading.Thread(target=lambda: [log.info(LINE) for _ in range(30_000)],
                             daemon=True)
    calls.start()
    calls.join(60)  # a guard against a hang, not a speed claim
    assert not calls.is_alive(), "a logging call waited for the log's reader"
    assert logs._writer is not None
    assert logs._writer.handler.dropped > 0
    got = bytearray()
    reader = threading.Thread(target=drain, args=(read_end, got), daemon=True)
    reader.start()
    logs._writer.lines.join()  # every waiting line written
    log.warning("after the reader came back")
    logs._writer.stop()
    stream.close()
    reader.join(60)
    os.close(read_end)
    text = got.decode()
    assert "log line(s) dropped: the log's reader did not keep up" in text
    assert text.rstrip().endswith("WARNING migratory.test: after the reader came back")
    kept = text.count(LINE)
    dropped = int(text.split(" log line(s) dropped")[0].rsplit(" ", 1)[1])
    assert kept + dropped == 30_000  # every line written or counted


def test_text_and_json_lines_are_as_before(restore_root: None) -> None:
    for log_format in ("text", "json"):
        stream = io.StringIO()
        logs.configure_logging("INFO", log_format, stream)
        log = logging.getLogger("migratory.test")
        log.debug("not at INFO")
        log.info("client %s", "c1", extra={"client": "c1", "peer": "127.0.0.1:5"})
        try:
            raise ValueError("boom")
        except ValueError:
            log.exception("it failed")
        assert logs._writer is not None
        logs._writer.stop()
        lines = stream.getvalue().splitlines()
        if log_format == "json":
            records = [json.loads(line) for line in lines]
            assert [r["message"] for r in records] == ["client c1", "it failed"]
            assert records[0]["client"] == "c1" and records[0]["peer"] == "127.0.0.1:5"
            assert "ValueError: boom" in records[1]["exception"]
        else:
            assert lines[0].endswith(" INFO migratory.test: client c1")
            assert lines[1].endswith(" ERROR migratory.test: it failed")
            assert lines[-1] == "ValueError: boom"


def test_a_forked_child_writes_its_lines_itself(restore_root: None) -> None:
    """The Raft dump writer is a forked child: no writer thread there."""
    read_end, write_end = os.pipe()
    stream = os.fdopen(write_end, "w")
    logs.configure_logging("INFO", "text", stream)
    pid = os.fork()
    if pid == 0:  # the child
        code = 1
        try:
            logging.getLogger("migratory.child").warning("from the child")
            stream.flush()
            code = 0
        finally:
            os._exit(code)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    assert logs._writer is not None
    logs._writer.stop()
    stream.close()
    got = bytearray()
    drain(read_end, got)
    os.close(read_end)
    assert "WARNING migratory.child: from the child" in got.decode()


def test_last_words_come_after_the_log_lines(restore_root: None) -> None:
    """``migratory: <error>`` (cluster/cli.py) is printed after :func:`write_directly`:
    the last line on stderr, after every log line logged before it."""
    stream = io.StringIO()
    logs.configure_logging("INFO", "text", stream)
    log = logging.getLogger("migratory.test")
    for index in range(2_000):
        log.info("line %d", index)
    logs.write_directly()
    print("migratory: the last words", file=stream)
    log.info("logged after")  # written at once, on this thread
    lines = stream.getvalue().splitlines()
    assert len(lines) == 2_002
    assert lines[-2] == "migratory: the last words"
    assert lines[-1].endswith("INFO migratory.test: logged after")
