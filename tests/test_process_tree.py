"""tests/process_tree.py: a run waited for by its CPU and what it says fails on a hang or
a loop, and leaves no process of its tree behind (a child outlives its killed parent)."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import pytest
from process_tree import CpuBound, run_within, wait_within

SLEEPER = """
import subprocess, sys, time
child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
print(child.pid, flush=True)
time.sleep(60)
"""


def gone(pid: int) -> bool:
    """``pid`` ended and was reaped, within 5 s (a killed orphan waits for init)."""
    for _ in range(50):
        try:
            state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
        except OSError:
            return True
        if state == "Z":
            return True
        time.sleep(0.1)
    return False


def test_a_hang_fails_and_its_whole_tree_is_killed() -> None:
    proc = subprocess.Popen([sys.executable, "-c", SLEEPER], stdout=subprocess.PIPE, text=True)
    assert proc.stdout is not None
    grandchild = int(proc.stdout.readline())
    with pytest.raises(AssertionError, match="sleeper stalled at"):
        wait_within(proc, CpuBound("sleeper", cpu_limit=60.0, stall_seconds=2.0))
    assert proc.returncode is not None
    assert gone(grandchild)


def test_a_loop_fails_on_its_cpu() -> None:
    proc = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    with pytest.raises(AssertionError, match="spinner used"):
        wait_within(proc, CpuBound("spinner", cpu_limit=0.5, stall_seconds=60.0))
    assert proc.returncode is not None


def test_what_a_run_says_is_its_progress(tmp_path: Path) -> None:
    """Four lines 0.5 s apart keep a run that uses no CPU going past a 2.5 s stall
    bound; then its silence fails it."""
    talker = "import time\nfor i in range(4):\n    print(i, flush=True); time.sleep(0.5)\n"
    talker += "time.sleep(60)\n"
    with pytest.raises(AssertionError, match="talker said nothing for"):
        run_within([sys.executable, "-c", talker],
                   CpuBound("talker", cpu_limit=60.0, stall_seconds=2.5), tmp_path, says=True)
    assert (tmp_path / "talker.out").read_text().split() == ["0", "1", "2", "3"]
