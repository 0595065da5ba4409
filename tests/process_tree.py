"""A test's heavy subprocess (spark-submit, a chaos run, a deploy play) waited for by the
CPU that it and everything under it use, not by the wall clock.

Such a run does a fixed amount of work whatever the load; its wall time is that work over
the share of the two cores the box gives it (CI: load 15-30). A wall limit failed runs
that were only slow (9e9e07c: spark-submit past 300 s at load > 20). Here a run fails
when it uses more than ``cpu_limit`` (a loop) or less than ``stall_cpu`` in
``stall_seconds`` (a hang), and the whole tree is killed then: a child outlives its
killed parent (spark-submit's Python driver its JVM; a chaos run's members their
runner) and would go on using the cores of the tests after it.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

CLK_TCK = os.sysconf("SC_CLK_TCK")


def process_tree(pid: int) -> dict[int, float]:
    """``pid`` and its descendants: the CPU seconds of each (with the children it waited
    for)."""
    parents: dict[int, int] = {}
    ticks: dict[int, int] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
            except OSError:
                continue  # gone meanwhile
            parents[int(entry.name)] = int(fields[1])
            ticks[int(entry.name)] = sum(int(f) for f in fields[11:15])  # u, s, cu, cs
    tree, grown = {pid}, True
    while grown:
        more = {child for child, parent in parents.items() if parent in tree} - tree
        tree |= more
        grown = bool(more)
    return {p: ticks.get(p, 0) / CLK_TCK for p in tree}


def kill_tree(pid: int) -> None:
    """SIGKILL ``pid`` and every descendant it has now."""
    for each in process_tree(pid):
        with contextlib.suppress(ProcessLookupError):
            os.kill(each, signal.SIGKILL)


@dataclass(frozen=True)
class CpuBound:
    """How much CPU a run may use, and how long without progress shows it hangs."""

    name: str  # in the failure: "<name> used 130 s of CPU", "<name> stalled ..."
    cpu_limit: float  # CPU seconds of the whole tree: more is a loop
    stall_seconds: float = 90.0  # wall seconds in which it must make progress
    stall_cpu: float = 1.0  # progress, unless the run says what it does (wait_within)


def wait_within(proc: subprocess.Popen[Any], bound: CpuBound,
                said: Callable[[], int] | None = None) -> int:
    """``proc``'s exit status once it ends. It and its descendants are killed, and the
    test fails, if they use more than ``bound.cpu_limit`` of CPU or make no progress in
    ``bound.stall_seconds``: use ``bound.stall_cpu`` of CPU or, given ``said`` (how many
    lines the run printed), print a line. A run that waits on its own processes while
    they poll one another (a chaos runner's members heartbeat, its proxies carry it, its
    sampler asks them: 0.4 of a core for a runner hung after "cluster ready") uses CPU
    while it hangs; what it says shows it moves."""
    done, seen = 0.0, time.monotonic()  # the progress, when it was last seen to grow
    try:
        while proc.poll() is None:
            time.sleep(1)
            used = sum(process_tree(proc.pid).values())
            assert used < bound.cpu_limit, f"{bound.name} used {used:.0f} s of CPU"
            progress = used if said is None else said() * bound.stall_cpu
            if progress - done >= bound.stall_cpu:
                done, seen = progress, time.monotonic()
            stalled = time.monotonic() - seen
            assert stalled < bound.stall_seconds, (
                f"{bound.name} stalled at {used:.1f} s of CPU" if said is None else
                f"{bound.name} said nothing for {stalled:.0f} s ({used:.1f} s of CPU)")
    finally:
        if proc.poll() is None:
            kill_tree(proc.pid)
            proc.wait(10)
    return proc.returncode


def run_within(args: list[str], bound: CpuBound, output: Path, *, says: bool = False,
               **popen: Any) -> tuple[int, str, str]:
    """Run ``args`` to its end within ``bound``: its exit status, stdout and stderr, which
    go to files in the directory ``output`` (a pipe read at the end fills and blocks it).
    ``says``: its stdout lines are its progress (:func:`wait_within`'s ``said``)."""
    out, err = output / f"{bound.name}.out", output / f"{bound.name}.err"
    with out.open("wb") as stdout, err.open("wb") as stderr:
        proc = subprocess.Popen(args, stdout=stdout, stderr=stderr, **popen)
    try:
        wait_within(proc, bound, said=(lambda: out.read_bytes().count(b"\n")) if says else None)
    finally:
        stdout_text, stderr_text = (f.read_text(errors="replace") for f in (out, err))
        print(stdout_text[-6000:], stderr_text[-3000:])
    return proc.returncode, stdout_text, stderr_text
