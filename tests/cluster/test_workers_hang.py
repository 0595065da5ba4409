"""Workers = N: a worker that hangs instead of crashing, with real processes on
127.0.0.1 (docs/workers.md). SIGSTOP stands for a worker whose event loop stopped
turning (an endless loop in a Custom entitlement plugin, a stuck system call): the
kernel still queues 1/N of the new connections on its listening socket, so without a
watchdog they wait forever (before: 5 of 10 new connections unanswered, nothing
logged, for as long as it hung). Its supervisor notices its heartbeats stop, kills it
after ``WorkerHangTime`` seconds and restarts it, as after a crash. (How silence is
counted, a supervisor held up itself included: test_workers_heartbeats.py.)"""

from __future__ import annotations

import contextlib
import os
import signal
from pathlib import Path

from test_workers import SUBJECT, WorkersServer, alive, clients_on_every_worker, connect

from migratory.model.message import Message
from migratory.protocol import ops


def test_a_hung_worker_is_killed_and_restarted_and_new_clients_are_answered(
    tmp_path: Path,
) -> None:
    server = WorkersServer(tmp_path, workers=2, WorkerHangTime="2")
    hung = server.pids[1]
    try:
        on = clients_on_every_worker(server.port, workers=2, per_worker=1)
        subscriber, publisher = on["migratory-worker-1"][0], on["migratory-worker-0"][0]
        subscriber.subscribe(SUBJECT)
        subscriber.recv_ops_until_status(ops.Status.SUBSCRIBE_ALLOW, timeout=10)
        os.kill(hung, signal.SIGSTOP)
        server.wait_log("worker 1 sent no heartbeat for 2 s (hung); killing it", timeout=30)
        server.wait_log("worker 1 is back", timeout=30)
        assert not alive(hung)
        assert server.pids[1] != hung
        # every new connection is answered (none waits in a hung worker's backlog); a
        # publish through either worker is acknowledged
        for i in range(20):
            client, worker = connect(server.port, f"after{i}", timeout=15)
            status = client.publish(Message(SUBJECT, f"m{i}".encode(), closure=str(i)))
            assert status.status is ops.Status.PUBLISH_OK, (worker, status)
            client.close()
        status = publisher.publish(Message(SUBJECT, b"last", closure="last"))
        assert status.status is ops.Status.PUBLISH_OK
        assert "Traceback" not in server.log()
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.kill(hung, signal.SIGCONT)
        server.stop()
        print(server.log()[-4000:])

