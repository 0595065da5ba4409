"""Workers = N: a worker restarted after the sequencer's ring stopped reaching back (more
than its 64 MiB of messages were published while the worker was down) is caught up
with a whole cache sync, in parts; here it is SIGKILLed again in the middle of that
sync, then restarted and synced once more. Real processes on 127.0.0.1
(docs/workers.md). A subscriber of the killed worker resumes from its last position on
each worker in turn: every message since, once, in order, with ``DATA_SYNC``."""

from __future__ import annotations

import os
import re
import signal
import sys
import time
from pathlib import Path

from test_workers import SUBJECT, WorkersServer, clients_on_every_worker, connect
from workers_reading import updates

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "server"))
from rawclient import RawClient, delivered

from migratory.model.message import Message
from migratory.model.position import Position
from migratory.protocol import ops

OTHERS = [f"/Workers/Sync/S{i}" for i in range(7)]
BULK = 640
"""Messages published while the worker is down, 7 in 8 of 124 KiB on other subjects:
~68 MiB, past the ring's 64 MiB (the subscriber's subject gets small ones: a resume
answer past ClientMaxPendingBytes would be refused, "subscribe answer too large")."""
CONTENT = 124 * 1024

HOLD_RESTART = """
import os, time
# (tests/cluster/test_workers_sync_kill.py) a worker started while the file HOLD names
# exists waits, before any import, until it is gone: it comes back only once the test
# has published what it must find beyond the sequencer's ring
hold = os.environ.get("HOLD_WORKER_START", "")
if hold and b"--worker-index" in open("/proc/self/cmdline", "rb").read():
    deadline = time.monotonic() + 120
    while os.path.exists(hold) and time.monotonic() < deadline:
        time.sleep(0.02)
"""


def publish_pipelined(publisher: RawClient, messages: list[Message]) -> list[ops.PublishStatus]:
    for message in messages:
        publisher.send_op(ops.Publish(message))
    statuses: list[ops.PublishStatus] = []
    while len(statuses) < len(messages):
        op = publisher.recv_op(timeout=30)
        if isinstance(op, ops.PublishStatus):
            statuses.append(op)
    return statuses


def wait_for(server: WorkersServer, pattern: str, count: int) -> None:
    for _ in range(1200):
        if len(re.findall(pattern, server.log())) >= count:
            return
        time.sleep(0.025)
    raise AssertionError(f"{pattern!r} not logged {count} times:\n{server.log()[-3000:]}")


def test_a_worker_killed_during_its_whole_cache_sync_comes_back_and_clients_resume(
    tmp_path: Path,
) -> None:
    (tmp_path / "sitecustomize.py").write_text(HOLD_RESTART)
    hold = tmp_path / "hold-worker-start"
    root = str(Path(__file__).resolve().parents[2])
    server = WorkersServer(tmp_path, workers=2, env={
        "PYTHONPATH": os.pathsep.join([str(tmp_path), root]),
        "HOLD_WORKER_START": str(hold)})
    try:
        on = clients_on_every_worker(server.port, workers=2, per_worker=1)
        subscriber, publisher = on["migratory-worker-1"][0], on["migratory-worker-0"][0]
        subscriber.subscribe(SUBJECT)
        subscriber.recv_ops_until_status(ops.Status.SUBSCRIBE_ALLOW, timeout=10)
        acked: list[tuple[bytes, Position]] = []

        def publish(messages: list[Message]) -> None:
            for message, status in zip(messages, publish_pipelined(publisher, messages),
                                       strict=True):
                assert status.status is ops.Status.PUBLISH_OK, status
                assert status.closure == message.closure and status.position is not None
                if message.subject == SUBJECT:
                    acked.append((message.content, status.position))

        publish([Message(SUBJECT, f"m{i:04d}".encode(), closure=f"m{i}") for i in range(10)])
        seen = updates(subscriber, 10, "before the kill")
        last = seen[-1].position
        hold.touch()  # its restart waits until the ring no longer reaches back (was: it
        # came back in the middle of the publishing on a busy box, and caught up from the
        # ring: the sync this test kills never happened; CI failed so)
        os.kill(server.pids[1], signal.SIGKILL)
        bulk = []
        for i in range(BULK):
            subject = SUBJECT if i % 8 == 0 else OTHERS[i % 7]
            content = f"b{i:04d}".encode()
            if subject != SUBJECT:
                content = content.ljust(CONTENT, b".")
            bulk.append(Message(subject, content, closure=f"b{i}"))
        for start in range(0, BULK, 40):  # (40 at a time: within the publisher's outbox)
            publish(bulk[start:start + 40])
        hold.unlink()
        restarted = r"replicating to worker-1 from clsn 0 \(sync \(beyond the ring\)"
        wait_for(server, restarted, 1)
        second = [int(p) for p in re.findall(r"worker 1 started \(pid (\d+)\)", server.log())]
        os.kill(second[-1], signal.SIGKILL)  # in the middle of its whole cache sync
        wait_for(server, r"worker 1 started \(pid", 3)
        wait_for(server, restarted, 2)
        wait_for(server, r"worker 1 is back", 1)
        publish([Message(SUBJECT, f"n{i:04d}".encode(), closure=f"n{i}") for i in range(5)])
        missed = [p for _, p in acked if p.seq > last.seq]
        for worker in ("migratory-worker-0", "migratory-worker-1"):
            for attempt in range(200):
                resumed, landed = connect(server.port, f"r{attempt}")
                if landed == worker:
                    break
                resumed.close()
            else:
                raise AssertionError(f"never landed on {worker}")
            resumed.send_op(ops.Subscribe((ops.SubscriptionRequest(SUBJECT, position=last),)))
            got = resumed.recv_ops_until_status(ops.Status.DATA_SYNC, timeout=30)
            statuses = [op.status for op in got if isinstance(op, ops.SubjectStatus)]
            assert ops.Status.DATA_RESYNC not in statuses, (worker, statuses)
            positions = [m.position for m in delivered(got)]
            assert positions == missed, f"{worker}: gap, duplicate or reorder after the sync"
            resumed.close()
        log = server.log()
        print(f"{len(missed)} missed; worker 1 started {log.count('worker 1 started')} times")
        assert "Traceback" not in log
    finally:
        server.stop()
        print(server.log()[-4000:])
