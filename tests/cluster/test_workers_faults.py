"""Workers = N under faults, with real processes on 127.0.0.1: a worker SIGKILLed while
both workers' publishers have publishes with closures in flight (docs/workers.md)."""

from __future__ import annotations

import os
import signal
import sys
import threading
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import pytest
from test_workers import SUBJECT, WorkersServer, clients_on_every_worker
from workers_reading import updates_until

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "server"))
from rawclient import RawClient

from migratory.model.message import Message
from migratory.model.position import Position
from migratory.protocol import ops

PIPELINED = 200
BURST = 25


class PipelinedPublisher(threading.Thread):
    """Publishes PIPELINED messages in bursts of BURST sent at once, reading their
    statuses meanwhile, until all are answered or its worker died. Once its first burst
    is answered and its second sent (in flight), ``in_flight`` is set."""

    def __init__(self, client: RawClient, prefix: str) -> None:
        super().__init__(daemon=True)
        self.client, self.prefix = client, prefix
        self.statuses: list[ops.PublishStatus] = []
        self.in_flight = threading.Event()
        self.sent = 0

    def run(self) -> None:
        reader = threading.Thread(target=self._read, daemon=True)
        reader.start()
        try:
            for burst in range(PIPELINED // BURST):
                for _ in range(BURST):
                    content = f"{self.prefix}{self.sent:03d}"
                    self.client.send_op(ops.Publish(Message(SUBJECT, content.encode(),
                                                            closure=content)))
                    self.sent += 1
                if burst == 0:
                    deadline = time.monotonic() + 10
                    while len(self.statuses) < BURST and time.monotonic() < deadline:
                        time.sleep(0.005)
                elif burst == 1:
                    self.in_flight.set()
                time.sleep(0.02)
        except OSError:  # its worker was killed
            pass
        reader.join(15)

    def _read(self) -> None:
        try:
            while len(self.statuses) < PIPELINED:
                op = self.client.recv_op(timeout=10)
                if isinstance(op, ops.PublishStatus):
                    self.statuses.append(op)
        except (OSError, AssertionError):  # its worker was killed
            pass

    def ok(self) -> dict[bytes, Position]:
        out = {}
        for status in self.statuses:
            if status.status is ops.Status.PUBLISH_OK:
                assert status.closure is not None and status.position is not None
                out[status.closure.encode()] = status.position
        return out


@pytest.fixture
def server(tmp_path: Path) -> Iterator[WorkersServer]:
    started = WorkersServer(tmp_path)
    try:
        yield started
    finally:
        started.stop()
        print(started.log()[-4000:])


def test_a_worker_killed_with_publishes_in_flight_loses_no_acknowledged_one(
    server: WorkersServer,
) -> None:
    on = clients_on_every_worker(server.port, workers=2, per_worker=2)
    subscriber, survivor = on["migratory-worker-0"]
    victim = on["migratory-worker-1"][1]
    subscriber.subscribe(SUBJECT)
    subscriber.recv_ops_until_status(ops.Status.SUBSCRIBE_ALLOW, timeout=10)
    publishers = [PipelinedPublisher(survivor, "a"), PipelinedPublisher(victim, "b")]
    for publisher in publishers:
        publisher.start()
    assert publishers[1].in_flight.wait(10)
    in_flight = publishers[1].sent - len(publishers[1].statuses)
    os.kill(server.pids[1], signal.SIGKILL)  # with a burst of publishes in flight
    for publisher in publishers:
        publisher.join(20)
    survived, died = publishers
    print(f"killed with {in_flight} sent and unanswered; it answered {len(died.statuses)} "
          f"of {died.sent} sent")
    # every publish gets exactly one status on the surviving worker, all numbered
    assert Counter(s.closure for s in survived.statuses) == {f"a{i:03d}": 1
                                                              for i in range(PIPELINED)}
    assert all(s.status is ops.Status.PUBLISH_OK for s in survived.statuses)
    # on the killed one: no closure answered twice, no refusal, fewer than all
    assert max(Counter(s.closure for s in died.statuses).values()) == 1
    assert all(s.status is ops.Status.PUBLISH_OK for s in died.statuses)
    assert BURST <= len(died.statuses) < died.sent <= PIPELINED
    # the subscriber on the surviving worker: every acknowledged one, at its position,
    # contiguous seqs (no gap, no duplicate); the killed worker's unanswered publishes
    # may be there too (numbered before it died) or not
    acked = {**survived.ok(), **died.ok()}
    got = updates_until(subscriber, acked, "the surviving worker's subscriber")
    assert {m.content: m.position for m in got if m.content in acked} == acked
    seqs = [m.seq for m in got]
    assert seqs == list(range(seqs[0], seqs[0] + len(seqs))), "gap or duplicate"
    assert [m.content for m in got if m.content.startswith(b"a")] == sorted(
        c for c in acked if c.startswith(b"a"))
