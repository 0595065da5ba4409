#!/usr/bin/env python3
"""How long a seed cut off from the seed majority still says it is ready.

Three seeds (real member processes). In each round two seeds are SIGSTOPped -- their
links go silent, as behind a partition, rather than closed -- and the third's
``/readyz`` is polled every 50 ms until it answers 503; then the two are SIGCONTed and
every seed made ready again. Each seed is left alone once per three rounds, leader or
follower (docs/cluster.md, "What a seed's readiness promises"). Wall clock on the
machine as it is: indicative on a busy box.

    .venv/bin/python benchmarks/seed_cut_off_readiness.py [--rounds 3]
"""

from __future__ import annotations

import argparse
import contextlib
import os
import signal
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from cluster_common import BenchCluster


def not_ready_reason(cluster: BenchCluster, i: int) -> str | None:
    """None while the member answers /readyz 200, else what it says."""
    try:
        with urllib.request.urlopen(f"{cluster.http(i)}/readyz", timeout=2):
            return None
    except urllib.error.HTTPError as exc:
        return exc.read().decode(errors="replace").strip()
    except OSError as exc:
        return str(exc)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    with BenchCluster("seed-cut-off") as cluster:
        cluster.start_all()
        cluster.wait_ready()
        for round_no in range(args.rounds):
            alone = round_no % 3
            others = [i for i in range(3) if i != alone]
            leader = cluster.status(alone).get("raft_state")
            started = time.monotonic()
            for i in others:
                os.kill(cluster.pid(i), signal.SIGSTOP)
            try:
                deadline = started + 30
                while (reason := not_ready_reason(cluster, alone)) is None:
                    if time.monotonic() > deadline:
                        reason = "still ready after 30 s"
                        break
                    time.sleep(0.05)
                took = time.monotonic() - started
            finally:
                for i in others:
                    with contextlib.suppress(OSError):
                        os.kill(cluster.pid(i), signal.SIGCONT)
            print(f"round {round_no + 1}: seed {alone} ({leader}) alone: not ready after "
                  f"{took:.2f} s: {reason}", flush=True)
            cluster.wait_ready()
    return 0


if __name__ == "__main__":
    sys.exit(main())
