"""How the supervisor starts a worker process (cluster/worker_process.py): from its own
thread, so a worker's parent-death signal (prctl PR_SET_PDEATHSIG, which Linux sends
when the *thread* that started it ends) comes only when the supervisor is gone."""

from __future__ import annotations

import sys

import pytest
import trio
import trio._core._thread_cache as thread_cache

from cluster.workers import Supervisor
from migratory.config import load_config

pytestmark = pytest.mark.skipif(sys.platform != "linux", reason="PR_SET_PDEATHSIG is Linux")

ORPHANED = 3
CHILD = f"""
import ctypes, os, signal, time
def orphaned(signum, frame):
    os._exit({ORPHANED})
signal.signal(signal.SIGUSR1, orphaned)
ctypes.CDLL(None).prctl(1, signal.SIGUSR1, 0, 0, 0)  # PR_SET_PDEATHSIG, as a worker does
print("armed", flush=True)
time.sleep(2.0)
"""


def test_a_worker_is_not_sent_its_parent_death_signal_while_its_supervisor_runs(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A stand-in worker that asks for SIGUSR1 when its parent dies (a worker asks for
    SIGCONT, which cannot be told apart from an operator's) lives its 2 s out. Started
    with trio's open_process, from one of trio's cached threads, it got the signal when
    that thread ended, idle (after 10 s; here 0.5 s): real workers held with SIGSTOP were
    let go 10 s after their start, with their supervisor alive."""
    monkeypatch.setattr(thread_cache, "IDLE_TIMEOUT", 0.5)
    config = load_config(overrides={"Listen": "127.0.0.1:0", "Workers": "2"}, environ={})
    supervisor = Supervisor(config, [])
    monkeypatch.setattr(supervisor, "_command", lambda index: [sys.executable, "-c", CHILD])
    slot = supervisor.slots[0]

    async def main() -> int:
        with trio.fail_after(30):  # (a bound on a hang)
            return await supervisor._run_once(slot)

    code = trio.run(main)
    assert code != ORPHANED, "the worker got its parent-death signal from a live supervisor"
    assert code == 0
    assert slot.held_lines == ["armed"]
