"""CPU use of the chaos runner itself, of its member processes and of the machine.

Read from ``/proc`` (utime + stime in clock ticks) and ``time.process_time()``; the
runner prints a figure per progress period and the totals go to ``run.json``, so a
run shows whether the load generator (this process: proxies, clients, nemesis) or the
members used the cores.
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterable

CLK_TCK = os.sysconf("SC_CLK_TCK")


def process_cpu(pid: int) -> float | None:
    """utime + stime of ``pid`` in seconds, None when it is gone."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            stat = f.read()
    except OSError:
        return None
    fields = stat[stat.rindex(b")") + 2 :].split()
    return (int(fields[11]) + int(fields[12])) / CLK_TCK


def machine_busy() -> tuple[float, float]:
    """(busy, total) CPU seconds of the whole machine since boot (all cores)."""
    with open("/proc/stat") as f:
        parts = [int(x) for x in f.readline().split()[1:]]
    idle = parts[3] + (parts[4] if len(parts) > 4 else 0)
    total = sum(parts[:8])
    return (total - idle) / CLK_TCK, total / CLK_TCK


class CpuMeter:
    """Accumulates CPU seconds per period: the runner, its members (by PID, so a killed
    member's CPU up to its last sample still counts) and the machine."""

    def __init__(self) -> None:
        self.t0 = time.monotonic()
        self.runner0 = time.process_time()
        self.machine0 = machine_busy()
        self.members_total = 0.0
        self._last_pid: dict[int, float] = {}
        self._last = (self.t0, self.runner0, 0.0, self.machine0)

    def sample(self, pids: Iterable[int]) -> dict[str, float]:
        """Shares of one core since the last call: runner, members, machine (all cores)."""
        for pid in pids:
            now_cpu = process_cpu(pid)
            if now_cpu is not None:
                self.members_total += now_cpu - self._last_pid.get(pid, 0.0)
                self._last_pid[pid] = now_cpu
        now, runner, machine = time.monotonic(), time.process_time(), machine_busy()
        t, r, m, (busy, _) = self._last
        wall = max(1e-6, now - t)
        out = {
            "runner": (runner - r) / wall,
            "members": (self.members_total - m) / wall,
            "machine": (machine[0] - busy) / wall,
        }
        self._last = (now, runner, self.members_total, machine)
        return out

    def totals(self) -> dict[str, float]:
        wall = time.monotonic() - self.t0
        runner = time.process_time() - self.runner0
        machine = machine_busy()[0] - self.machine0[0]
        return {
            "wall_seconds": round(wall, 1),
            "runner_cpu_seconds": round(runner, 1),
            "members_cpu_seconds": round(self.members_total, 1),
            "machine_busy_seconds": round(machine, 1),
            "runner_share_of_a_core": round(runner / max(wall, 1e-6), 3),
        }
