"""CPU meter for ``benchmarks/uring_send_cpu.py`` (issue 13): per delivery, the sending
(loop) thread's CPU, the process's, the process's other threads by kind -- the kernel's
``iou-sqp`` SQ thread and ``iou-wrk`` io-wq workers, from each task's
``/proc/self/task/<tid>/schedstat`` (ns; the ``stat`` ticks proved unreliable for the SQ
thread), plus "exited" for threads gone by the end -- the reader processes' CPU, the
machine's (``/proc/stat``, % of one core) and this benchmark's own (process + readers)."""

from __future__ import annotations

import os
import threading
import time
from typing import Any


def _ticks(path: str) -> int:
    with open(path) as stat:
        fields = stat.read().rpartition(")")[2].split()
    return int(fields[11]) + int(fields[12])  # utime + stime (fields 14, 15)


def _machine_busy() -> tuple[int, int]:
    with open("/proc/stat") as stat:
        values = [int(v) for v in stat.readline().split()[1:]]
    idle = values[3] + values[4]
    return sum(values[:8]) - idle, sum(values[:8])


def _tasks() -> dict[int, tuple[str, int]]:
    """This process's threads: tid -> (name, ns of CPU from ``schedstat``)."""
    tasks = {}
    for entry in os.scandir("/proc/self/task"):
        try:
            with open(f"{entry.path}/comm") as comm, open(f"{entry.path}/schedstat") as stat:
                tasks[int(entry.name)] = (comm.read().strip(), int(stat.read().split()[0]))
        except (FileNotFoundError, ProcessLookupError):
            continue  # the thread exited meanwhile
    return tasks


def thread_split(
    start: dict[int, tuple[str, int]], end: dict[int, tuple[str, int]], loop_tid: int,
    others_s: float,
) -> dict[str, float]:  # fmt: skip
    """Seconds of CPU of the threads other than the loop's, by kind: ``iou-sqp``,
    ``iou-wrk``, ``other`` (any other name) among the threads alive at the end, and
    ``exited``: ``others_s`` (process - loop thread) minus those."""
    split = {"iou-sqp": 0.0, "iou-wrk": 0.0, "other": 0.0}
    for tid, (name, ns) in end.items():
        if tid == loop_tid:
            continue
        kind = name[:7] if name[:7] in ("iou-sqp", "iou-wrk") else "other"
        split[kind] += (ns - start.get(tid, (name, 0))[1]) / 1e9
    split["exited"] = max(0.0, others_s - sum(split.values()))
    return split


class Meter:
    """CPU of the sending thread, the process, its kernel threads, the readers, the box."""

    def __init__(self, readers: list[int]) -> None:
        self.readers = readers
        self.loop_tid = threading.get_native_id()
        self.tasks = _tasks()
        self.start = self._sample()

    def _sample(self) -> dict[str, float]:
        busy, total = _machine_busy()
        return {
            "thread": time.thread_time(), "process": time.process_time(),
            "wall": time.perf_counter(), "busy": busy, "total": total,
            "readers": sum(_ticks(f"/proc/{pid}/stat") for pid in self.readers)
            / os.sysconf("SC_CLK_TCK"),
        }  # fmt: skip

    def stop(self, deliveries: int) -> dict[str, Any]:
        end, start = self._sample(), self.start
        tasks = _tasks()
        d = {key: end[key] - start[key] for key in end}
        per = 1e6 / max(deliveries, 1)
        split = thread_split(self.tasks, tasks, self.loop_tid, d["process"] - d["thread"])
        workers = sum(1 for name, _ns in tasks.values() if name.startswith("iou-wrk"))
        return {
            **{f"{kind}_us": seconds * per for kind, seconds in split.items()},
            "iou_wrk_alive": workers,
            "thread_us": d["thread"] * per, "process_us": d["process"] * per,
            # the process's other threads: the kernel's iou-sqp / iou-wrk threads
            "sq_thread_us": max(0.0, d["process"] - d["thread"]) * per,
            "readers_us": d["readers"] * per,
            "machine_pct": 100 * (os.cpu_count() or 1) * d["busy"] / max(d["total"], 1),
            # this benchmark's own share (the sending process and its readers), which
            # other load on a shared machine does not inflate
            "ours_pct": 100 * (d["process"] + d["readers"]) / max(d["wall"], 1e-9),
            "wall_s": d["wall"],
        }  # fmt: skip
