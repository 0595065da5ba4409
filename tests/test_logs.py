"""The server's log lines (migratory/logs.py): written by a thread, never waited for."""

from __future__ import annotations

import io
import json
import logging
import os
import pty
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import TextIO

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
    try:
        while chunk := os.read(fd, 65536):
            into += chunk
    except OSError:  # a terminal whose other end closed: EIO
        pass


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
    assert logs.lines_dropped() == dropped  # (migratory_log_lines_dropped_total)


class Piped:
    """A pipe as the log's stream, its reader draining it in a thread."""

    def __init__(self) -> None:
        read_end, write_end = os.pipe()
        self._read_end = read_end
        self.stream = os.fdopen(write_end, "w")
        self.got = bytearray()
        self._reader = threading.Thread(target=drain, args=(read_end, self.got), daemon=True)
        self._reader.start()

    def text(self) -> str:
        """Everything written, once the writer has stopped."""
        self.stream.close()
        self._reader.join(60)
        os.close(self._read_end)
        return self.got.decode()


def log_three(log_format: str, stream: TextIO) -> None:
    logs.configure_logging("INFO", log_format, stream)
    log = logging.getLogger("migratory.test")
    log.debug("not at INFO")
    log.info("client %s", "c1", extra={"client": "c1", "peer": "127.0.0.1:5"})
    try:
        raise ValueError("boom")
    except ValueError:
        log.exception("it failed")


@pytest.mark.parametrize("log_format", ["text", "json"])
@pytest.mark.parametrize("to", ["pipe", "file"])
def test_text_and_json_lines_are_as_before(restore_root: None, log_format: str,
                                           to: str) -> None:
    if to == "pipe":
        piped = Piped()
        log_three(log_format, piped.stream)
        assert logs._writer is not None  # through the writer thread
        logs._writer.stop()
        lines = piped.text().splitlines()
    else:
        stream = io.StringIO()
        log_three(log_format, stream)
        assert logs._writer is not None and logs._writer.handler.wait > 0  # waited for
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


def test_a_file_gets_each_line_before_the_call_returns(restore_root: None,
                                                        tmp_path: Path) -> None:
    """A server's log in a file (tests read it right after an event): the call waits
    for the writer thread to have written its line."""
    with open(tmp_path / "server.log", "w") as stream:
        logs.configure_logging("INFO", "text", stream)
        for index in range(100):
            logging.getLogger("migratory.test").warning("malformed MQTT, closing: %d", index)
            assert f"closing: {index}\n" in (tmp_path / "server.log").read_text()


class StalledFile(io.StringIO):
    """A file on a disk that stalls: its writes wait until :attr:`back` is set."""

    def __init__(self) -> None:
        super().__init__()
        self.back = threading.Event()

    def write(self, text: str) -> int:
        self.back.wait(60)
        return super().write(text)


def log_lines_in_a_thread(count: int) -> threading.Thread:
    log = logging.getLogger("migratory.test")
    calls = threading.Thread(target=lambda: [log.info("%d %s", i, LINE) for i in range(count)],
                             daemon=True)
    calls.start()
    return calls


def test_a_file_whose_disk_stalls_holds_the_caller_once_and_briefly(
    restore_root: None,
) -> None:
    """The first line waits for the stalled write 0.1 s (WRITE_WAIT_SECONDS), the next
    ones not at all: 1,000 calls return while the disk stalls (before: the first one
    waited as long as the disk, here forever), and every line is written, in order, once
    the disk is back."""
    stream = StalledFile()
    logs.configure_logging("INFO", "text", stream)
    calls = log_lines_in_a_thread(1_000)
    calls.join(10)  # a guard against a hang; 100 waits of 0.1 s would take 10 s
    assert not calls.is_alive(), "a logging call waited for a stalled disk"
    assert stream.getvalue() == ""
    stream.back.set()
    assert logs._writer is not None
    logs._writer.stop()
    lines = stream.getvalue().splitlines()
    assert [int(line.split(": ")[1].split()[0]) for line in lines] == list(range(1_000))


def test_a_terminal_nobody_reads_does_not_stop_the_server(restore_root: None) -> None:
    """A terminal stopped (Ctrl-S, a stalled ssh session) holds ~16 KiB: 2,000 lines of
    ~150 bytes return while nobody reads it (before: a call waited for the reader; a
    real member kept its event loop from running for 5.0 s of a 4 s pause), and they all
    come once the terminal is read."""
    master, slave = pty.openpty()
    stream = os.fdopen(slave, "w")
    logs.configure_logging("INFO", "text", stream)
    calls = log_lines_in_a_thread(2_000)
    calls.join(10)
    stuck = calls.is_alive()
    got = bytearray()
    reader = threading.Thread(target=drain, args=(master, got), daemon=True)
    reader.start()  # (read before asserting: a stuck call holds the stream's lock)
    assert not stuck, "a logging call waited for the terminal"
    assert logs._writer is not None
    logs._writer.stop()
    stream.close()  # (the reader then sees EIO: drain ends)
    reader.join(10)
    os.close(master)
    assert got.decode().count(LINE) == 2_000


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
    piped = Piped()
    logs.configure_logging("INFO", "text", piped.stream)
    log = logging.getLogger("migratory.test")
    for index in range(2_000):
        log.info("line %d", index)
    logs.write_directly()
    print("migratory: the last words", file=piped.stream, flush=True)
    log.info("logged after")  # written at once, on this thread
    lines = piped.text().splitlines()
    assert len(lines) == 2_002
    assert lines[-2] == "migratory: the last words"
    assert lines[-1].endswith("INFO migratory.test: logged after")


def test_a_listening_line_is_one_write(monkeypatch: pytest.MonkeyPatch) -> None:
    """stdout and stderr one pipe (``2>&1``): a log line from the writer thread could
    land between ``print``'s text and its newline; :func:`print_line` writes both at
    once (the bench's "server did not start" with ``listening ws://...2026-11-28 ...``)."""
    writes: list[str] = []

    class Stdout(io.StringIO):
        def write(self, text: str) -> int:
            writes.append(text)
            return len(text)

    monkeypatch.setattr("sys.stdout", Stdout())
    logs.print_line("listening ws://127.0.0.1:8800")
    assert writes == ["listening ws://127.0.0.1:8800\n"]
