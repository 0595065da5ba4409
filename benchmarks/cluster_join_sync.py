"""A non-seed joining a Guaranteed cluster whose caches are large: does it become ready,
how long does it take, and how long do the seeds' event loops stop meanwhile?

Starts three seeds, fills their caches (acknowledged publishes of ``--size`` bytes over
``--subjects`` subjects at ``--rate`` for ``--fill`` seconds), then starts a fourth
member (a non-seed), which needs a whole cache sync from a seed before it is ready.
Reports the time to ready, the messages it then holds, each seed's largest loop gap
(/stats loop_gaps) in the seconds of the join, and the joiner's own (from its start to
a second after it is ready: receiving and installing the sync, then the batches that came
meanwhile); and what the seeds' gaps over 50 ms during the fill were made of (loop CPU,
waiting for a core, other threads' CPU, collections). A sync past 64 MiB (MAX_FRAME)
was refused by the encoder before cluster/link_sync.py: the member never became ready.

    .venv/bin/python benchmarks/cluster_join_sync.py --size 120000 --rate 200 --fill 3
    .venv/bin/python benchmarks/cluster_join_sync.py --size 100 --subjects 10000 \\
        --rate 20000 --fill 30
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from cluster_common import BenchCluster

from migratory.bench.procfs import handle_sigterm, machine_description
from migratory.bench.publisher import publish_paced

JOINER = 3


def loop_gaps(stats: dict, start: float, end: float) -> list[float]:
    """The largest loop gap (ms) of each monotonic second from start to end."""
    gaps = stats.get("loop_gaps") or {}
    return [g for s, g in gaps.get("per_second", []) if int(start) <= s <= int(end)]


def loop_gap(cluster: BenchCluster, i: int, start: float, end: float) -> float | None:
    """Member ``i``'s largest loop gap (ms) in the monotonic seconds from start to end."""
    inside = loop_gaps(cluster.stats(i), start, end)
    return max(inside) if inside else None


def long_gap_parts(before: dict, after: dict) -> dict:
    """What the member's loop gaps over 50 ms between two /stats were made of, in ms
    (migratory/server/loop_gaps.py GapParts): loop CPU, waiting for a core, other
    threads' CPU, collections."""
    was = (before.get("loop_gaps") or {})
    now = (after.get("loop_gaps") or {})
    parts = {k: round(v - (was.get("long_gap_parts_ms") or {}).get(k, 0.0))
             for k, v in (now.get("long_gap_parts_ms") or {}).items()}
    return {"gaps": now.get("long_gaps", 0) - was.get("long_gaps", 0), **parts}


def run(args: argparse.Namespace) -> dict:
    with BenchCluster("join-sync", members=4, seeds=3) as cluster:
        for i in range(3):
            cluster.start(i)
        cluster.wait_ready([0, 1, 2], timeout=60)
        before_fill = [cluster.stats(i) for i in range(3)]
        filling = time.monotonic()
        fill = publish_paced(
            "127.0.0.1", cluster.port(0), rate=args.rate, duration=args.fill,
            size=args.size, subjects=args.subjects,
        )
        cached = [cluster.stats(i).get("cached_messages") for i in range(3)]
        time.sleep(1.2)  # a quiet second before the join
        filled = time.monotonic() - 1.2
        seed_stats = [cluster.stats(i) for i in range(3)]
        fill_seconds = [loop_gaps(stats, filling, filled) for stats in seed_stats]
        fill_gaps = [max(gaps) if gaps else None for gaps in fill_seconds]
        started = time.monotonic()
        cluster.start(JOINER)
        try:
            took: float | None = cluster.wait_ready([JOINER], timeout=args.timeout)
        except TimeoutError:
            took = None
        ended = time.monotonic()
        time.sleep(1.2)  # the second of the join's end is in the seeds' per-second gaps
        joined = cluster.stats(JOINER) if took is not None else {}
        joiner_gaps = loop_gaps(joined, started, time.monotonic())
        return {
            "machine": machine_description(),
            "size": args.size,
            "subjects": args.subjects,
            "fill": {k: fill.get(k) for k in ("acked", "failed", "sent") if k in fill},
            "seed_cached_messages": cached,
            "cached_mb": round((cached[0] or 0) * args.size / 1e6, 1),
            "ready_after_s": None if took is None else round(took, 2),
            "joiner_cached_messages": joined.get("cached_messages"),
            "joiner_max_loop_gap_ms": max(joiner_gaps) if joiner_gaps else None,
            "joiner_loop_gaps_over_50ms": sorted(g for g in joiner_gaps if g > 50),
            "seed_max_loop_gap_ms": [loop_gap(cluster, i, started, ended) for i in range(3)],
            "seed_max_loop_gap_while_filling_ms": fill_gaps,
            "seed_loop_gaps_over_50ms_while_filling": [  # largest of each second
                sorted(g for g in gaps if g > 50) for gaps in fill_seconds
            ],
            "seed_long_gap_parts_while_filling_ms": [
                long_gap_parts(before, after)
                for before, after in zip(before_fill, seed_stats, strict=True)
            ],
            "seed_gc_after_filling": [stats.get("gc") for stats in seed_stats],
            "logs": str(cluster.log_dir),
        }


def main() -> None:
    handle_sigterm()
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--size", type=int, default=120_000)
    parser.add_argument("--subjects", type=int, default=1)
    parser.add_argument("--rate", type=float, default=200)
    parser.add_argument("--fill", type=float, default=3.0, help="seconds of publishing")
    parser.add_argument("--timeout", type=float, default=60.0, help="seconds to wait for ready")
    print(json.dumps(run(parser.parse_args()), indent=2))


if __name__ == "__main__":
    main()
