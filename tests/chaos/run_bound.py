"""How long a test lets a real chaos run (``python -m chaos run``) go: by the CPU that
it and its members use and by what it says, not by the wall clock (tests/process_tree.py).

A light run (tests/chaos/conftest.py) of 15 s used ~20 s of CPU (3.5 s the runner,
12.6 s its members in 44 s of wall, load 14). Its members heartbeat and its proxies
carry them whether the run moves or not, ~0.45 of a core: a runner hung after "cluster
ready" used as much (56 s of CPU in 154 s). Its phases have their own wall bounds
(readiness 60 s, subscribers 15 s, the faults, the heal's readiness 60 s and catch-up
15 s, the drain 10 s: ~190 s and the duration), which cap a run that ends on its own at
~0.5 x (duration + 190) s of CPU: more is a loop. It says what it does (a progress line
every 5 s from the workload on, silent at most through a 60 s readiness wait): 120 s
without a line is a hang. The tests had ``duration + 150`` or ``+ 200`` s of wall time,
which a loaded box can pass (test_chaos_checked.py's call took 69-271 s in CI).
"""

from __future__ import annotations

from process_tree import CpuBound

RUNNER_BOUNDS = 190  # s of wall time: the runner's own waits besides the duration
SHARE = 0.5  # of a core: the run and its members while it runs


def chaos_run_bound(duration: float) -> CpuBound:
    """A chaos run of ``duration`` s: a loop past its CPU, a hang silent 120 s."""
    return CpuBound("chaos run", cpu_limit=SHARE * (duration + RUNNER_BOUNDS) + 30,
                    stall_seconds=120.0)
