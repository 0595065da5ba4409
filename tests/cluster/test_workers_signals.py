"""Workers = N: SIGINT (Ctrl-C) or SIGTERM to the supervisor while a killed worker is
being brought back -- waiting for its restart, just started, or catching up (held
there with SIGSTOP) -- with real processes on 127.0.0.1 (docs/workers.md). The
supervisor exits 0 and no worker process it ever started outlives it (checked by
pid), none logs a traceback."""

from __future__ import annotations

import contextlib
import os
import re
import signal
import time
from pathlib import Path

import pytest
from test_workers import WorkersServer, alive, connect


def started(server: WorkersServer, index: int) -> list[int]:
    return [int(p) for p in re.findall(rf"worker {index} started \(pid (\d+)\)", server.log())]


def wait_started(server: WorkersServer, index: int, count: int) -> int:
    for _ in range(400):
        pids = started(server, index)
        if len(pids) >= count:
            return pids[count - 1]
        time.sleep(0.05)
    raise AssertionError(f"worker {index} not started {count} times:\n{server.log()[-3000:]}")


def wait_replicating(server: WorkersServer, count: int) -> None:
    """Until the sequencer logged ``count`` worker links replicating (a restarted worker
    has dialled it and is being caught up)."""
    for _ in range(400):
        if len(re.findall(r"replicating to worker-1 from", server.log())) >= count:
            return
        time.sleep(0.05)
    raise AssertionError(f"worker 1 never asked to be caught up:\n{server.log()[-3000:]}")


@pytest.mark.parametrize(
    ("when", "sig"),
    [("restart-delay", signal.SIGINT), ("just-started", signal.SIGTERM),
     ("catching-up", signal.SIGTERM)],
)
def test_a_signal_while_a_killed_worker_comes_back_stops_every_worker(
    tmp_path: Path, when: str, sig: signal.Signals
) -> None:
    """(Each pair tried with both signals: the same; SIGTERM's drain is the longer way.)"""
    server = WorkersServer(tmp_path, workers=2, DrainTime="1")
    try:
        client, _ = connect(server.port, "c")
        os.kill(server.pids[1], signal.SIGKILL)
        if when == "restart-delay":
            server.wait_log("worker 1 stopped (signal SIGKILL); restarting it in")
        elif when == "just-started":
            wait_started(server, 1, 2)
        else:
            restarted = wait_started(server, 1, 2)
            wait_replicating(server, 2)
            os.kill(restarted, signal.SIGSTOP)  # caught up no further
        server.proc.send_signal(sig)
        assert server.proc.wait(30) == 0  # the 30 s only guard against a hang
        if when == "catching-up":  # (it was SIGKILLed, stopped, by the supervisor)
            with contextlib.suppress(ProcessLookupError):
                os.kill(restarted, signal.SIGCONT)
        everyone = started(server, 0) + started(server, 1)
        print("started:", everyone)
        for _ in range(100):  # a zombie reaped by init (its parent exited) goes at once
            if not any(alive(pid) for pid in everyone):
                break
            time.sleep(0.05)
        assert not [pid for pid in everyone if alive(pid)], "a worker outlived its supervisor"
        log = server.log()
        assert "stopped: 2 workers" in log
        assert "Traceback" not in log, log[-3000:]
        client.close()
    finally:
        server.stop()
        print(server.log()[-4000:])


def test_a_sigint_while_the_workers_drain_stops_them_at_once(tmp_path: Path) -> None:
    """SIGTERM: the workers drain (a client that never leaves: ~5 s, its close times
    out); a Ctrl-C then is passed on and each stops at once. Before, the supervisor read
    no more signals once stopping: the SIGINT did nothing until the drain ended."""
    server = WorkersServer(tmp_path, workers=2, DrainTime="3600")
    try:
        client, _ = connect(server.port, "stays")  # reads nothing more: never leaves
        server.proc.send_signal(signal.SIGTERM)
        server.wait_log("draining 1 clients (DrainTime 3600 s)")
        server.proc.send_signal(signal.SIGINT)
        assert server.proc.wait(30) == 0  # (the 30 s a guard: before, an hour's drain)
        log = server.log()
        assert "SIGINT received while the workers drain: passing it on" in log
        assert "SIGINT received while draining: stopping at once" in log
        assert "1 clients told to reconnect elsewhere" not in log  # cut short, not ended
        assert "Traceback" not in log, log[-3000:]
        everyone = started(server, 0) + started(server, 1)
        for _ in range(100):  # a zombie reaped by init (its parent exited) goes at once
            if not any(alive(pid) for pid in everyone):
                break
            time.sleep(0.05)
        assert not [pid for pid in everyone if alive(pid)], "a worker outlived its supervisor"
        client.close()
    finally:
        server.stop()
        print(server.log()[-4000:])
