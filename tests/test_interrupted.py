"""Ctrl-C in every command-line tool (migratory/interrupted.py): one line, exit status
130, never a traceback -- while the tool imports its modules (held there, not timed:
tests/held_imports.py) and while it runs. ``migratory serve`` (exit 0, its own line) is
tests/test_start_signals.py; ``sub`` once subscribed (exit 0) tests/client."""

from __future__ import annotations

import signal
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from held_imports import as_from_a_terminal, start_held_at
from listen_ports import listen_port

PYTHON = sys.executable
MIGRATORY = str(Path(sys.executable).with_name("migratory"))


def _interrupted(process: subprocess.Popen[bytes]) -> tuple[int, str]:
    process.send_signal(signal.SIGINT)
    try:
        _, stderr = process.communicate(timeout=60)  # (a guard against a hang only)
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
    return process.returncode, stderr.decode()


# Before: a KeyboardInterrupt traceback from the middle of the import, exit status 1 or
# -2 (python -m chaos, spark_analysis, migratory.bench); 130 without a word (migratory).
@pytest.mark.parametrize(("module", "args", "prog"), [
    ("chaos.schedule", [PYTHON, "-m", "chaos", "replay-schedule", "--seed", "1",
                        "--duration", "10"], "python -m chaos"),
    ("spark_analysis.load", [PYTHON, "-m", "spark_analysis", "run"], "python -m spark_analysis"),
    ("migratory.bench.cli", [PYTHON, "-m", "migratory.bench", "--self-test"], "migratory bench"),
    ("migratory.bench.cli", [MIGRATORY, "bench", "--self-test"], "migratory"),
    ("migratory.cli_client", [MIGRATORY, "pub", "/a/b", "x"], "migratory"),
    ("cluster.tooling", [MIGRATORY, "cluster", "status"], "migratory"),
], ids=["chaos", "spark_analysis", "python-m-bench", "bench", "pub", "cluster-status"])
def test_ctrl_c_while_a_command_imports_is_one_line_and_130(
    tmp_path: Path, module: str, args: list[str], prog: str
) -> None:
    process = start_held_at(tmp_path, module, args)
    assert process.stderr is not None
    assert process.stderr.readline().decode() == f"importing {module}\n"
    code, stderr = _interrupted(process)
    assert (code, stderr) == (130, f"{prog}: interrupted (Ctrl-C)\n")


@pytest.mark.parametrize(("module", "args"), [
    ("chaos.schedule", [PYTHON, "-m", "chaos", "replay-schedule", "--seed", "1",
                        "--duration", "10"]),
    ("migratory.bench.cli", [PYTHON, "-m", "migratory.bench", "--help"]),
    ("migratory.cli_client", [MIGRATORY, "--help"]),
], ids=["chaos", "python-m-bench", "migratory"])
def test_a_command_started_with_sigint_ignored_keeps_ignoring_it(
    tmp_path: Path, module: str, args: list[str]
) -> None:
    """A background job of a script (``tool &``, nohup) is started with SIGINT ignored:
    the terminal's Ctrl-C is for the foreground job. Before: ``python -m chaos`` and
    ``migratory.bench`` put their own handler over it and ended (130)."""
    process = start_held_at(tmp_path, module, args, sigint_ignored=True)
    assert process.stderr is not None
    assert process.stderr.readline().decode() == f"importing {module}\n"
    process.send_signal(signal.SIGINT)
    _, stderr = process.communicate(b"go", timeout=60)  # the import goes on
    assert (process.returncode, stderr.decode()) == (0, "")


@pytest.fixture
def silent_server() -> Iterator[tuple[socket.socket, int]]:
    """A loopback port that accepts connections and never answers: a command waits."""
    server = socket.socket()
    port = listen_port()
    server.bind(("127.0.0.1", port))
    server.listen(16)
    server.settimeout(60)
    try:
        yield server, port
    finally:
        server.close()


@pytest.mark.parametrize(("args", "prog"), [
    # before: exit 130 without a word
    ([MIGRATORY, "pub", "/a/b", "x", "--server", "ws://127.0.0.1:{port}"], "migratory"),
    # before: "interrupted", the run counted failed: exit 2 (--compare: on to the next broker)
    ([PYTHON, "-m", "migratory.bench", "fanout", "--url", "ws://127.0.0.1:{port}/",
      "--subscribers", "1", "--swarm", "python", "--no-progress"], "migratory bench"),
], ids=["pub", "bench"])
def test_ctrl_c_while_a_command_waits_for_its_server_is_one_line_and_130(
    silent_server: tuple[socket.socket, int], args: list[str], prog: str
) -> None:
    server, port = silent_server
    process = subprocess.Popen([arg.format(port=port) for arg in args],
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                               preexec_fn=as_from_a_terminal)
    connection, _ = server.accept()  # the command is connecting: past its imports
    try:
        code, stderr = _interrupted(process)
    finally:
        connection.close()
    assert code == 130
    assert stderr.splitlines()[-1] == f"{prog}: interrupted (Ctrl-C)", stderr
    assert "Traceback" not in stderr


def test_an_output_file_in_no_directory_is_refused_before_the_run(tmp_path: Path) -> None:
    """Before: the benchmark ran, then a FileNotFoundError traceback."""
    result = subprocess.run(
        [MIGRATORY, "bench", "fanout", "--json", str(tmp_path / "none" / "r.json")],
        capture_output=True, text=True, timeout=60,
    )
    assert result.returncode == 2
    assert result.stderr.splitlines()[-1] == (
        f"migratory bench: error: argument --json: '{tmp_path}/none/r.json': "
        f"no such directory '{tmp_path}/none'")
