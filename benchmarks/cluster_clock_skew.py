"""Three real seeds, one with its wall clock off (libfaketime): what the cluster does and says.

Needs the Debian package ``faketime`` (``LD_PRELOAD`` of ``libfaketime.so.1``). The seed
``--seed`` (default 2) runs ``--offset`` (default ``+600``: 10 minutes ahead; ``-600``
behind) off the others; its monotonic clock is faked by the same constant (faketime's
``FAKETIME_DONT_FAKE_MONOTONIC=1`` made ``time.sleep`` fail with EINVAL in pysyncobj's
tick thread on libfaketime 0.9.10: a thread died, not the product's doing), which no
product timer can tell from the real one.

``--scenario fresh``: every seed starts with an empty ClusterDataDir, the skewed one
among them. ``--scenario restart``: the three start right and form the cluster (up to
60 s), then the skewed seed is stopped and started again off the others, with its data.
After ``--settle`` seconds each seed's ``GET /cluster`` (readiness and its reason, as
``/readyz`` says it, Raft state, leader, linked seeds, ``raft_refused_by``,
``raft_front``) is printed as one JSON line, then the log lines about clocks. Every
member is stopped by PID at the end.

Usage: ``python benchmarks/cluster_clock_skew.py --scenario restart --offset +600``.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from cluster_common import BenchCluster

LIBFAKETIME = "/usr/lib/x86_64-linux-gnu/faketime/libfaketime.so.1"
CLOCK_WORDS = ("off this clock", "without answering", "clock went back", "wall clock stepped")


class SkewedCluster(BenchCluster):
    """A BenchCluster whose member ``skewed`` runs under libfaketime while ``offset``."""

    skewed: int = -1
    offset: str | None = None

    def start(self, i: int) -> None:
        if i != self.skewed or self.offset is None:
            super().start(i)
            return
        saved = dict(os.environ)
        os.environ.update(LD_PRELOAD=LIBFAKETIME, FAKETIME=self.offset, FAKETIME_NO_CACHE="1")
        try:
            super().start(i)  # (the member's environment is a copy of this one's)
        finally:
            os.environ.clear()
            os.environ.update(saved)


    def stop_one(self, i: int) -> None:
        proc = self.procs[i]
        assert proc is not None
        proc.send_signal(signal.SIGTERM)
        proc.wait(15)


def report(cluster: SkewedCluster) -> None:
    for i in range(cluster.members):
        try:
            status = cluster.status(i)
        except OSError as exc:
            print(json.dumps({"seed": i, "error": str(exc)}))
            continue
        print(json.dumps({
            "seed": i, "skewed": i == cluster.skewed,
            **{key: status.get(key) for key in (
                "ready", "not_ready_reason", "raft_state", "raft_leader", "raft_linked_seeds",
                "raft_refused_by",
                "raft_front")},
        }))
    for i in range(cluster.members):
        lines = (cluster.log_dir / f"migratory-{i}.log").read_text(errors="replace")
        for line in lines.splitlines():
            if any(word in line for word in CLOCK_WORDS):
                print(f"seed {i}: {line[:240]}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--scenario", choices=("fresh", "restart"), default="restart")
    parser.add_argument("--offset", default="+600", help="faketime offset, e.g. +600, -7200")
    parser.add_argument("--seed", type=int, default=2, choices=(0, 1, 2))
    parser.add_argument("--settle", type=float, default=20.0)
    args = parser.parse_args()
    if not Path(LIBFAKETIME).exists():
        sys.exit(f"{LIBFAKETIME} is missing: apt-get install faketime")
    with SkewedCluster("clock-skew") as cluster:
        cluster.skewed = args.seed
        if args.scenario == "restart":
            cluster.start_all()
            print(json.dumps({"formed_in_s": round(cluster.wait_ready(timeout=60), 2)}))
            cluster.stop_one(args.seed)
        cluster.offset = args.offset
        if args.scenario == "fresh":
            cluster.start_all()
        else:
            cluster.start(args.seed)
        time.sleep(args.settle)
        report(cluster)
        print(f"logs: {cluster.log_dir}")


if __name__ == "__main__":
    main()
