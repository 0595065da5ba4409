"""Workers = N under repeated kills, with real processes on 127.0.0.1 (docs/workers.md):
the same worker SIGKILLed again while it restarts, every worker killed in turn, every
worker killed at once. A subscriber on each worker resumes through the shared port
from its last position each time its worker dies: every acknowledged message once, in
order, with ``DATA_SYNC`` (the positions live in the supervisor, which no kill here
touches), never ``DATA_RESYNC``."""

from __future__ import annotations

import os
import re
import resource
import signal
import sys
import time
from pathlib import Path

from test_workers import SUBJECT, WorkersServer, alive, clients_on_every_worker, connect
from workers_mqtt import Publisher
from workers_reading import missing_text

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "server"))
from rawclient import RawClient, delivered

from migratory.model.message import Message, MessageType, Qos
from migratory.protocol import ops


class Resuming:
    """A subscriber that resubscribes from its last position on a new connection through
    the port whenever its connection ends."""

    def __init__(self, port: int, client: RawClient, name: str) -> None:
        self.port, self.client, self.name = port, client, name
        self.got: list[Message] = []
        self.statuses: list[ops.Status] = []
        self.resumes = 0
        self.outcomes_due = 0
        client.subscribe(SUBJECT)
        client.recv_ops_until_status(ops.Status.SUBSCRIBE_ALLOW, timeout=10)

    def _resume(self) -> None:
        self.client.close()
        self.client, _ = connect(self.port, self.name, timeout=30)
        position = self.got[-1].position if self.got else None
        self.client.send_op(ops.Subscribe((ops.SubscriptionRequest(SUBJECT, position=position),)))
        self.resumes += 1
        self.outcomes_due += 1

    def read_until(self, contents: set[bytes]) -> None:
        """Until every one of ``contents`` came, and the outcome of every resume."""
        for _ in range(10_000):
            if not self.outcomes_due and contents <= {m.content for m in self.got}:
                return
            try:
                op = self.client.recv_op(timeout=10)
            except TimeoutError:  # connected, and nothing came for 10 s
                raise AssertionError(f"{self.name}: nothing for 10 s after {self.resumes} "
                                     f"resumes, {self.outcomes_due} resume outcomes due, "
                                     f"{self._missing(contents)}") from None
            except (OSError, AssertionError):  # its worker died (reset, or closed)
                self._resume()
                continue
            if isinstance(op, ops.SubjectStatus):
                self.statuses.append(op.status)
                if op.status in (ops.Status.DATA_SYNC, ops.Status.DATA_RESYNC):
                    self.outcomes_due -= 1
            self.got += [m for m in delivered([op]) if m.type is not MessageType.SNAPSHOT]
        raise AssertionError(f"{self.name}: not every message came, {self._missing(contents)}")

    def _missing(self, contents: set[bytes]) -> str:
        return missing_text(sorted(contents), [m.content for m in self.got])


def check(subscribers: list[Resuming], publishing: Publisher) -> None:
    acked = publishing.positions
    for subscriber in subscribers:
        subscriber.read_until(set(acked))
        got = subscriber.got
        print(f"{subscriber.name}: {len(got)} messages, {subscriber.resumes} resumes, "
              f"statuses {subscriber.statuses}")
        seqs = [m.seq for m in got]
        assert seqs == list(range(seqs[0], seqs[0] + len(seqs))), "gap or duplicate"
        assert len({m.epoch for m in got}) == 1
        assert {m.content: m.position for m in got if m.content in acked} == acked
        assert ops.Status.DATA_RESYNC not in subscriber.statuses
        assert subscriber.statuses.count(ops.Status.DATA_SYNC) == subscriber.resumes


def start(tmp_path: Path, workers: int) -> tuple[WorkersServer, list[Resuming], Publisher]:
    server = WorkersServer(tmp_path, workers=workers)
    on = clients_on_every_worker(server.port, workers=workers, per_worker=1)
    subscribers = [Resuming(server.port, clients[0], name) for name, clients in sorted(on.items())]
    return server, subscribers, Publisher(server.port, qos=Qos.STANDARD)


def starts(server: WorkersServer, index: int) -> list[int]:
    return [int(p) for p in re.findall(rf"worker {index} started \(pid (\d+)\)", server.log())]


def wait_started(server: WorkersServer, index: int, count: int) -> int:
    """The pid of worker ``index``'s ``count``-th start, once the supervisor logged it."""
    for _ in range(400):
        pids = starts(server, index)
        if len(pids) >= count:
            return pids[count - 1]
        time.sleep(0.05)
    raise AssertionError(f"worker {index} was not started {count} times:\n{server.log()[-3000:]}")


def wait_count(server: WorkersServer, text: str, count: int) -> None:
    for _ in range(400):
        if server.log().count(text) >= count:
            return
        time.sleep(0.05)
    raise AssertionError(f"{text!r} not logged {count} times:\n{server.log()[-3000:]}")


def test_a_worker_killed_again_while_it_restarts_comes_back_and_its_clients_resume(
    tmp_path: Path,
) -> None:
    server, subscribers, publishing = start(tmp_path, workers=2)
    try:
        publishing.publish(20)
        check(subscribers, publishing)
        pid = server.pids[1]
        for kill in range(1, 3):  # the restarted process killed as soon as it is started
            os.kill(pid, signal.SIGKILL)
            publishing.publish(10)
            pid = wait_started(server, 1, kill + 1)
        wait_count(server, "worker 1 stopped (signal SIGKILL); restarting it in", 2)
        delays = re.findall(r"worker 1 stopped .* restarting it in ([\d.]+) s", server.log())
        assert [float(d) for d in delays[1:]] == [2 * float(d) for d in delays[:-1]], delays
        server.wait_log("worker 1 is back")
        publishing.publish(20)
        check(subscribers, publishing)
        assert alive(pid) and server.pids[1] == pid
        on = clients_on_every_worker(server.port, workers=2, per_worker=1)  # both serve
        assert sorted(on) == ["migratory-worker-0", "migratory-worker-1"]
        assert "Traceback" not in server.log()
    finally:
        server.stop()
        print(server.log()[-4000:])


def test_every_worker_killed_in_turn_then_all_at_once(tmp_path: Path) -> None:
    server, subscribers, publishing = start(tmp_path, workers=2)
    try:
        publishing.publish(10)
        for index in range(2):  # rolling: each one back before the next is killed
            os.kill(server.pids[index], signal.SIGKILL)
            publishing.publish(10)
            wait_started(server, index, 2)
            server.wait_log(f"worker {index} is back")
        check(subscribers, publishing)
        assert all(s.resumes >= 1 for s in subscribers)
        victims = list(server.pids.values())
        for pid in victims:  # no worker left: clients wait for the first one back
            os.kill(pid, signal.SIGKILL)
        publishing.publish(10)
        check(subscribers, publishing)
        for index in range(2):
            wait_started(server, index, 3)
        wait_count(server, "is back", 4)
        assert not any(alive(pid) for pid in victims)
        assert "Traceback" not in server.log()
    finally:
        server.stop()
        print(server.log()[-4000:])


def test_a_restart_that_cannot_start_is_tried_again_and_the_others_serve_on(
    tmp_path: Path,
) -> None:
    """The supervisor out of file descriptors (as out of processes under a container's
    pids limit) when it restarts a killed worker: it says so and tries again, the other
    worker serving meanwhile, and the worker comes back once it can. Before, the failed
    start (OSError) ended the supervisor -- every worker stopped, exit 1, "migratory: Too
    many open files": one worker's crash took the whole server down."""
    server = WorkersServer(tmp_path)
    try:
        supervisor = server.proc.pid
        limits = resource.prlimit(supervisor, resource.RLIMIT_NOFILE)
        # below what it holds: what the killed worker's end frees does not make room
        held = len(os.listdir(f"/proc/{supervisor}/fd"))
        resource.prlimit(supervisor, resource.RLIMIT_NOFILE, (held - 4, limits[1]))
        os.kill(server.pids[0], signal.SIGKILL)
        deadline = time.monotonic() + 20
        while "worker 0 could not be started" not in server.log() and time.monotonic() < deadline:
            assert server.proc.poll() is None, f"the server stopped:\n{server.log()[-1500:]}"
            time.sleep(0.05)
        assert "worker 0 could not be started (Too many open files); trying again" in server.log()
        client, worker = connect(server.port, "meanwhile")
        assert worker == "migratory-worker-1"
        status = client.publish(Message(SUBJECT, b"served", closure="1"))
        assert status.status is ops.Status.PUBLISH_OK, status
        client.close()
        assert server.proc.poll() is None
        resource.prlimit(supervisor, resource.RLIMIT_NOFILE, limits)
        server.wait_log("worker 0 is back")
        server.proc.send_signal(signal.SIGINT)
        assert server.proc.wait(15) == 0
    finally:
        server.stop()
