"""A stop signal sent again while ``migratory serve`` is already stopping -- an operator's
second Ctrl-C, a ``kill`` repeated, a supervisor's SIGINT after its SIGTERM -- changes
nothing: the stop asked for first is done, exit 0, no traceback (README, "Starting and
stopping": "a second SIGTERM is only logged").

Each test sends the first signal, then the next ones (SIGTERM and SIGINT in turn) every
few milliseconds until the process has gone: one of them lands in each step of the
stop, the last of which is Python's own finalization. Before, that last step had
Python's default dispositions back (it restores them before it tears the modules down,
100-300 ms of a server's exit): the repeated signal killed the server (exit status -15
or -2) after its stop had been done and said.
"""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from pathlib import Path

from held_imports import start_held_at

MIGRATORY = str(Path(sys.executable).with_name("migratory"))
AGAIN_EVERY = 0.002
AGAIN_AT_MOST = 10_000
"""Signals sent again, at most (a bound: 20 s of them)."""


def signal_until_gone(process: subprocess.Popen[bytes]) -> int:
    """SIGTERM and SIGINT in turn every :data:`AGAIN_EVERY` s until ``process`` exits;
    how many were sent."""
    sent = 0
    while process.poll() is None and sent < AGAIN_AT_MOST:
        try:
            process.send_signal(signal.SIGINT if sent % 2 else signal.SIGTERM)
        except ProcessLookupError:
            break
        sent += 1
        time.sleep(AGAIN_EVERY)
    return sent


def ended(process: subprocess.Popen[bytes]) -> tuple[bytes, bytes]:
    try:
        return process.communicate(timeout=30)  # (a guard against a hang only)
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()


def test_stop_signals_again_while_a_stop_during_start_up_ends_it(tmp_path: Path) -> None:
    server = start_held_at(tmp_path, "trio", [MIGRATORY, "serve", "--set",
                                              "Listen=127.0.0.1:0"])
    try:
        assert server.stderr is not None
        assert server.stderr.readline() == b"importing trio\n"
        server.send_signal(signal.SIGTERM)
        sent = signal_until_gone(server)
    finally:
        stdout, stderr = ended(server)
    print(f"{sent} signals again;", stderr.decode())
    assert server.returncode == 0
    # (one line; it names the first signal Python handled: the SIGINT sent 2 ms after the
    # SIGTERM may be pending with it, and Python runs the lower number's handler first)
    assert stderr.decode() in {f"migratory: {name} received during start-up: stopped\n"
                               for name in ("SIGTERM", "SIGINT")}
    assert stdout == b""


def test_stop_signals_again_while_a_serving_server_stops(tmp_path: Path) -> None:
    server = subprocess.Popen(
        [MIGRATORY, "serve", "--set", "Listen=127.0.0.1:0", "--set", "DrainTime=0"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, cwd=tmp_path)
    try:
        assert server.stdout is not None
        assert server.stdout.readline().startswith(b"listening ")
        server.send_signal(signal.SIGTERM)
        sent = signal_until_gone(server)
    finally:
        _, stderr = ended(server)
    log = stderr.decode()
    print(f"{sent} signals again;", log[-2000:])
    assert server.returncode == 0
    assert "Traceback" not in log
    assert "SIGTERM received: shutting down" in log
    assert "migratory.server: stopped:" in log
