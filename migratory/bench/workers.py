"""A server with ``Workers`` > 1 in the bench: its worker processes' CPU and the
/stats of every worker (one port: the kernel picks the worker that answers).

Workers = 1 is one process: these give the same figures as before for it.
"""

from __future__ import annotations

import os
import time
from typing import Any

from migratory.bench.server_process import server_stats

SUMMED = ("writes", "bytes_written", "frames_fanned_out", "slow_consumers",
          "connections_open", "messages_published")


def child_pids(pid: int) -> list[int]:
    """The children of ``pid`` (a supervisor's workers), from /proc: of every thread, as
    trio starts processes from a worker thread."""
    children: list[int] = []
    try:
        for task in os.listdir(f"/proc/{pid}/task"):
            with open(f"/proc/{pid}/task/{task}/children") as f:
                children += [int(p) for p in f.read().split()]
    except OSError:
        pass
    return children


def worker_pids(server_pid: int) -> dict[str, int]:
    """``{"server-worker-N": pid}`` for each process under the server (none for one)."""
    return {f"server-worker-{k}": p for k, p in enumerate(sorted(child_pids(server_pid)))}


def all_workers_stats(
    host: str, port: int, workers: int, timeout: float = 10.0
) -> dict[str, Any] | None:
    """/stats of every worker, merged: counters summed, loop gaps the largest per second.
    Asks until each worker (its ``server`` name) has answered once."""
    if workers <= 1:
        return server_stats(host, port)
    seen: dict[str, dict[str, Any]] = {}
    deadline = time.monotonic() + timeout
    while len(seen) < workers and time.monotonic() < deadline:
        stats = server_stats(host, port)
        if stats is not None:
            seen.setdefault(str(stats.get("server")), stats)
    if not seen:
        return None
    merged: dict[str, Any] = dict(next(iter(seen.values())))
    for key in SUMMED:
        merged[key] = sum(s.get(key, 0) for s in seen.values())
    gaps: dict[int, float] = {}
    for stats in seen.values():
        for second, gap in (stats.get("loop_gaps") or {}).get("per_second") or []:
            gaps[second] = max(gap, gaps.get(second, 0.0))
    merged["loop_gaps"] = {"per_second": sorted(gaps.items())}
    merged["workers_answered"] = sorted(seen)
    return merged
