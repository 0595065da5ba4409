"""SIGINT (Ctrl-C) and SIGTERM while ``migratory serve`` starts, before its event loop
listens for them (migratory/stop_signals.py): one line, exit 0, no traceback.

Each phase is held, not timed (tests/held_imports.py): the import of one module waits
until the signal comes. Before: a SIGTERM there ended the process silently (exit status
-15), a SIGINT printed a KeyboardInterrupt traceback from the middle of the import (exit
status 1 or -2).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import trio
from held_imports import start_held_at

from migratory import stop_signals
from migratory.config import Config
from migratory.server.app import Server
from migratory.server.run import run_until_signalled

# the console script operators run (``cluster.cli:main``), installed next to the interpreter
MIGRATORY = str(Path(sys.executable).with_name("migratory"))


def serve_held_at(tmp_path: Path, module: str, *settings: str) -> subprocess.Popen[bytes]:
    args = [MIGRATORY, "serve", "--set", "Listen=127.0.0.1:0"]
    for setting in settings:
        args += ["--set", setting]
    return start_held_at(tmp_path, module, args)


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM], ids=["SIGINT", "SIGTERM"])
@pytest.mark.parametrize(("module", "settings"), [
    ("trio", ()),  # the first heavy import: the configuration is not read yet
    ("cluster.members", ()),  # the configuration read, the server about to be built
    ("cluster.workers", ("Workers=2",)),  # a supervisor about to start its workers
])
def test_a_stop_signal_while_the_server_imports_is_one_line_and_exit_0(
    tmp_path: Path, sig: signal.Signals, module: str, settings: tuple[str, ...]
) -> None:
    server = serve_held_at(tmp_path, module, *settings)
    try:
        assert server.stderr is not None
        line = server.stderr.readline().decode()
        assert line == f"importing {module}\n", line
        server.send_signal(sig)
        stdout, stderr = server.communicate(timeout=30)  # (a guard against a hang only)
    finally:
        if server.poll() is None:
            server.kill()
            server.wait()
    print(stderr.decode())
    assert server.returncode == 0
    assert stderr.decode() == f"migratory: {sig.name} received during start-up: stopped\n"
    assert stdout == b""  # no "listening" line: it never listened


def test_a_stop_signal_noted_before_the_event_loop_starts_nothing(
    capsys: pytest.CaptureFixture[str], caplog: pytest.LogCaptureFixture
) -> None:
    """A signal between the last of start-up and the event loop's receiver is noted,
    then stops the server before it listens (the ``listening`` line is never printed)."""
    handlers = {s: signal.getsignal(s) for s in stop_signals.STOP_SIGNALS}
    server = Server(Config.from_mapping({"Listen": "127.0.0.1:0"}))
    try:
        stop_signals.note_from_now()
        os.kill(os.getpid(), signal.SIGTERM)
        assert stop_signals.noted() == signal.SIGTERM
        caplog.set_level("INFO")
        trio.run(run_until_signalled, server)
    finally:
        for signum, handler in handlers.items():
            signal.signal(signum, handler)
        stop_signals._noted.clear()
    assert "listening" not in capsys.readouterr().out
    assert "SIGTERM received during start-up: shutting down" in caplog.text
    assert server.listeners == []


TRAPPED_PLUGIN = '''
import os
import signal


class _Collected:
    def __del__(self) -> None:  # Python prints what a __del__ raises, and goes on
        os.kill(os.getpid(), signal.SIGTERM)


_Collected()


class Plugin:
    def __init__(self, options: str) -> None: ...
    def allow_connect(self, client: object) -> bool: return True
    def allow_subscribe(self, client: object, subject: str) -> bool: return True
    def allow_publish(self, client: object, subject: str) -> bool: return True
'''


def test_a_stop_signal_that_lands_where_python_swallows_exceptions_still_stops(
    tmp_path: Path,
) -> None:
    """A SIGTERM handled inside a ``__del__`` (or a weakref callback: importlib's module
    locks have one, CI met it while a worker imported a plugin and its supervisor stopped
    it): the raise is printed and swallowed. Before: an 'Exception ignored in ...'
    traceback, then the server started and served as if never stopped."""
    (tmp_path / "trapped_plugin.py").write_text(TRAPPED_PLUGIN)
    env = {**os.environ, "PYTHONPATH": str(tmp_path)}
    server = subprocess.Popen(
        [MIGRATORY, "serve", "--set", "Listen=127.0.0.1:0", "--set", "Entitlement=Custom",
         "--set", "EntitlementPlugin=trapped_plugin:Plugin"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env)
    try:
        stdout, stderr = server.communicate(timeout=30)  # (a guard against a hang only)
    finally:
        if server.poll() is None:
            server.kill()
            server.wait()
    print(stderr.decode())
    assert "Traceback" not in stderr.decode()
    assert "SIGTERM received during start-up: shutting down" in stderr.decode()
    assert server.returncode == 0
    assert b"listening" not in stdout  # it never listened
