"""A single Raft seed in its own process, run under a file-size limit (tests only).

``python limited_seed.py DATA_DIR PORT`` starts one seed on ``DATA_DIR``, submits
publishes of 3 KB until one is not acknowledged within a second (at most
:data:`MAX_SUBMITS`), waits for the node to stop (at most 3 s), and prints one JSON line:
``{"acked": N, "clsn": the last committed, "stopped": reason or null}``. The parent sets the limit
(``RLIMIT_FSIZE``, with SIGXFSZ ignored): a file grown past it fails with EFBIG, a real
failure of the process's writes (``tests/cluster/test_raft_disk.py``). Its log goes to
stderr.
"""

from __future__ import annotations

import json
import logging
import sys
import threading
import time
from pathlib import Path

from cluster.coordination import CommittedBatch, PublishRequest
from cluster.raft import RaftCoordination, RaftTimings
from migratory.model.message import Message

MAX_SUBMITS = 100
BIG = [PublishRequest("o", 1, Message("/disk/full", b"x" * 3000, {}, False))]


def submitted(raft: RaftCoordination) -> bool:
    """Whether a publish is acknowledged within a second."""
    done = threading.Event()
    raft.submit(2, BIG, lambda clsn, error, unknown: done.set() if error is None else None)
    return done.wait(1.0)


def main() -> None:
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    data_dir, port = Path(sys.argv[1]), int(sys.argv[2])
    committed: list[CommittedBatch] = []
    raft = RaftCoordination(
        self_address=("127.0.0.1", port), seed_addresses=[("127.0.0.1", port)],
        password="x", on_commit=committed.append, data_dir=data_dir,
        timings=RaftTimings(compaction_entries=10**6, compaction_seconds=3600),
    )
    deadline = time.monotonic() + 10
    while not raft.snapshot.ready and time.monotonic() < deadline:
        time.sleep(0.02)
    acked = 0
    for _ in range(MAX_SUBMITS):
        if not submitted(raft):
            break
        acked += 1
    deadline = time.monotonic() + 3
    while raft.snapshot.stopped is None and time.monotonic() < deadline:
        time.sleep(0.02)
    clsn = committed[-1].clsn if committed else 0
    print(json.dumps({"acked": acked, "clsn": clsn, "stopped": raft.snapshot.stopped}), flush=True)
    raft.close()


if __name__ == "__main__":
    main()
