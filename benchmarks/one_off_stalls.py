"""The server's longest stops while one client creates 200,000 one-off subjects (issue 14),
measured in one process on the hub itself, in CPU time: figures that the machine's load
does not inflate (benchmarks/attacks.py measures the same attack end to end, in wall
time, with a bystander).

What the server does meanwhile is replayed on a simulated clock: a publish per new
subject at ``--rate`` publishes/s, the expiry slice every tick (100 ms, 2,000 subjects),
the monitoring sample (``Hub.statistics()``) every second; the garbage collector runs
with ``--gc`` thresholds and every pause is timed by ``gc.callbacks``.

    .venv/bin/python benchmarks/one_off_stalls.py [--subjects 200000] [--gc 20000,2,200]

It imports ``migratory`` from ``sys.path``: run it with ``PYTHONPATH=<another checkout>``
to measure that checkout's hub.
"""

from __future__ import annotations

import argparse
import gc
import json
import time
from collections import defaultdict
from typing import Any

from migratory.model.message import Message
from migratory.server.hub import Hub

TICK = 0.1
EXPIRE_BUDGET = 2000


class Stops:
    """The longest stop of each kind, in CPU ms (thread time) and wall ms."""

    def __init__(self) -> None:
        self.cpu: dict[str, float] = defaultdict(float)
        self.wall: dict[str, float] = defaultdict(float)
        self.count: dict[str, int] = defaultdict(int)
        self._started = (0.0, 0.0)

    def record(self, kind: str, cpu: float, wall: float) -> None:
        self.cpu[kind] = max(self.cpu[kind], cpu * 1000)
        self.wall[kind] = max(self.wall[kind], wall * 1000)
        self.count[kind] += 1

    def gc_callback(self, phase: str, info: dict[str, Any]) -> None:
        if phase == "start":
            self._started = (time.thread_time(), time.perf_counter())
        else:
            cpu, wall = self._started
            self.record(f"gc{info['generation']}", time.thread_time() - cpu,
                        time.perf_counter() - wall)

    def timed(self, kind: str, work: Any, *args: Any, **kwargs: Any) -> Any:
        cpu, wall = time.thread_time(), time.perf_counter()
        result = work(*args, **kwargs)
        self.record(kind, time.thread_time() - cpu, time.perf_counter() - wall)
        return result


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--subjects", type=int, default=200_000)
    parser.add_argument("--rate", type=float, default=20_000.0, help="publishes per second")
    parser.add_argument("--expire", type=float, default=5.0, help="CacheExpireTime")
    parser.add_argument("--gc", default="20000,2,200", help="gc.set_threshold")
    args = parser.parse_args()
    gc.set_threshold(*(int(x) for x in args.gc.split(",")))
    gc.collect()
    gc.freeze()  # as the server does after start-up
    stops = Stops()
    gc.callbacks.append(stops.gc_callback)
    hub = Hub(epoch=1, cache_expire_seconds=args.expire)
    now = next_tick = next_sample = 0.0
    peak_subjects = peak_objects = 0
    for i in range(args.subjects + int(args.rate * (args.expire + 2))):
        now = i / args.rate
        if i < args.subjects:  # a new subject each, as the attacker sends them
            hub.publish(Message(f"/OneOff/s{i}", b"x" * 100, {"n": str(i)}), now)
        if now >= next_tick:
            next_tick += TICK
            stops.timed("expire", hub.expire, now, budget=EXPIRE_BUDGET)
        if now >= next_sample:
            next_sample += 1.0
            stats = stops.timed("statistics", hub.statistics)
            if stats.subjects > peak_subjects:
                peak_subjects, peak_objects = stats.subjects, len(gc.get_objects())
    gc.callbacks.remove(stops.gc_callback)
    print(json.dumps({
        "gc_thresholds": args.gc,
        "subjects_at_peak": peak_subjects,
        "tracked_objects_at_peak": peak_objects,
        "subjects_after": hub.statistics().subjects,
        "longest_cpu_ms": {k: round(v, 1) for k, v in sorted(stops.cpu.items())},
        "longest_wall_ms": {k: round(v, 1) for k, v in sorted(stops.wall.items())},
        "count": dict(sorted(stops.count.items())),
    }))


if __name__ == "__main__":
    main()
