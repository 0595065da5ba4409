"""A full garbage collection over a seed's caches: how many objects it walks, how long.

Fills, in this process, what a Raft seed holds: its hub's cache (a Guaranteed member's,
positions numbered by the seeds) and the replicated cache, each under
``CacheMemoryBudget`` (default 256 MiB), with ``--messages`` messages of ``--size`` bytes
round-robin over ``--subjects`` subjects; everything alive before the fill is frozen
(``gc.freeze``, as the server does at start-up). Reports the fill's CPU per message,
the tracked objects per cached
message, by type, the items the collector visits through them (``gc.get_referents``: a
full collection walks each), and the wall time of ``gc.collect(2)``, best and median
of ``--collections``::

    .venv/bin/python benchmarks/cache_gc.py --messages 550000 --subjects 10000

(Before a change, the same script against the older tree: ``PYTHONPATH=/tmp/before``.)
"""

from __future__ import annotations

import argparse
import gc
import os
import statistics
import time
from collections import Counter

from cluster.replicated_cache import ReplicatedCache
from migratory.model.message import Message, Qos
from migratory.server.hub import Hub


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--messages", type=int, default=550_000)
    parser.add_argument("--subjects", type=int, default=10_000)
    parser.add_argument("--size", type=int, default=100)
    parser.add_argument("--budget", type=int, default=256 * 2**20)
    parser.add_argument("--collections", type=int, default=5)
    args = parser.parse_args()
    subjects = [f"/bench/subject/{i}" for i in range(args.subjects)]
    filler = os.urandom(args.size + 64)
    gc.collect()
    gc.freeze()
    hub = Hub(epoch=1, cache_memory_budget=args.budget, numbered_elsewhere=True)
    replicated = ReplicatedCache(1000, args.budget)
    seqs = [0] * args.subjects
    gc.disable()  # the fill's CPU alone (collections are measured below)
    fill_started = time.thread_time()
    for i in range(args.messages):
        s = i % args.subjects
        seqs[s] += 1
        message = Message("".join((subjects[s], "")), filler[i % 64:i % 64 + args.size],
                          {}, False, Qos.GUARANTEED, None, 7, seqs[s])
        replicated.append([message])
        hub.apply(message, 0.0)
    fill = time.thread_time() - fill_started
    gc.enable()
    cached = hub.statistics().cached_messages
    gc.collect()
    tracked = gc.get_objects()
    visited = sum(len(gc.get_referents(o)) for o in tracked)
    kinds = Counter(type(o).__name__ for o in tracked).most_common(6)
    del tracked
    pauses = []
    for _ in range(args.collections):
        started = time.perf_counter()
        gc.collect(2)
        pauses.append((time.perf_counter() - started) * 1000)
    print(f"{args.messages:,} messages over {args.subjects:,} subjects -> {cached:,} cached "
          f"in the hub (and as many in the replicated cache); the fill "
          f"{fill / args.messages * 1e6:.2f} us of CPU per message (both caches)")
    print(f"tracked objects {len(gc.get_objects()):,} ({len(gc.get_objects()) / cached:.3f}"
          f" per cached message): {', '.join(f'{k} {n:,}' for k, n in kinds)}")
    print(f"items the collector visits through them: {visited:,} "
          f"({visited / cached:.2f} per cached message)")
    print(f"gc.collect(2): best {min(pauses):.1f} ms, median {statistics.median(pauses):.1f} ms")


if __name__ == "__main__":
    main()
