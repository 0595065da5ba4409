"""Workers = N beyond the cores the server may run on: it starts (an operator may mean
it, a test on a small machine does), and says once, naming the key, that the workers
beyond the cores add memory and no throughput (docs/workers.md)."""

from __future__ import annotations

import os
from pathlib import Path

from test_workers import WorkersServer, connect


def test_more_workers_than_cores_is_said_naming_the_key(tmp_path: Path) -> None:
    cores = os.sched_getaffinity(0)
    os.sched_setaffinity(0, {min(cores)})  # the server inherits one core
    try:
        server = WorkersServer(tmp_path, workers=2)
    finally:
        os.sched_setaffinity(0, cores)
    try:
        _, worker = connect(server.port, "c")  # it serves
        assert worker.startswith("migratory-worker-")
        assert ("Workers = 2 is more than the cores this server may run on (1)"
                in server.log()), server.log()[-2000:]
    finally:
        server.stop()
