"""One seed's Raft node alone (the seeds' ``RaftCoordination``: pysyncobj with
``FollowerSafeSyncObj``, the coordinator as state machine, its journal on disk),
submitting one-publish commands as fast as ``--window`` commands in flight allow.

Started by ``cluster_raft_divergence.py --layer raft``, which reads the status this
writes to ``DIR/status.json`` every 0.2 s, kills and restarts it. Creating ``DIR/stop``
stops the submitting (the node keeps following); SIGTERM ends it.

    python benchmarks/raft_load_node.py --index I --base PORT --dir DIR [--follower pysyncobj]
"""

from __future__ import annotations

import argparse
import json
import logging
import signal
import sys
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from cluster.coordination import PublishRequest
from cluster.raft import RaftCoordination
from cluster.raft_follower import FollowerSafeSyncObj
from migratory.model.message import Message
from migratory.model.position import new_epoch

PASSWORD = "raft-load-password"


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--index", type=int, required=True)
    parser.add_argument("--base", type=int, required=True)
    parser.add_argument("--dir", type=Path, required=True)
    parser.add_argument("--window", type=int, default=64)
    parser.add_argument("--follower", choices=("ours", "pysyncobj"), default="ours")
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO, stream=sys.stderr,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    if args.follower == "pysyncobj":  # pysyncobj 0.3.17's own AppendEntries handling
        del FollowerSafeSyncObj._SyncObj__onMessageReceived
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    seeds = [("127.0.0.1", args.base + 10 * i) for i in range(3)]
    raft = RaftCoordination(
        self_address=seeds[args.index], seed_addresses=seeds, password=PASSWORD,
        on_commit=lambda batch: None, data_dir=args.dir / "data",
    )
    counts = {"ok": 0, "failed": 0, "submitted": 0}
    slots = threading.Semaphore(args.window)

    def done(clsn: int | None, error: str | None, unknown: bool) -> None:
        counts["ok" if error is None else "failed"] += 1
        slots.release()

    epoch, origin = new_epoch(), f"load-{args.index}-{time.monotonic_ns()}"
    next_status = 0.0
    try:
        while True:
            now = time.monotonic()
            if now >= next_status:
                next_status = now + 0.2
                status = {**raft.status(), **counts, "time": time.time()}
                tmp = args.dir / "status.json.tmp"
                tmp.write_text(json.dumps(status))
                tmp.replace(args.dir / "status.json")
            if (args.dir / "stop").exists() or not slots.acquire(timeout=0.05):
                time.sleep(0.05)
                continue
            counts["submitted"] += 1
            n = counts["submitted"]
            message = Message(f"/raft/load/s{n % 100}", b"%010d" % n)
            raft.submit(epoch, [PublishRequest(origin, n, message)], done)
    finally:
        raft.close()


if __name__ == "__main__":
    sys.exit(main())
