"""Workers = N with real processes on 127.0.0.1: a supervisor (the sequencer) and worker
processes sharing one port (SO_REUSEPORT); see docs/workers.md."""

from __future__ import annotations

import contextlib
import json
import os
import queue
import re
import signal
import subprocess
import sys
import threading
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "server"))
from rawclient import RawClient, delivered
from workers_reading import updates

from migratory.bench.procfs import die_with_parent
from migratory.model.message import Message, MessageType
from migratory.model.position import Position
from migratory.protocol import close_codes, ops

SUBJECT = "/Workers/Test/Subject"

pytestmark = pytest.mark.skipif(sys.platform != "linux", reason="SO_REUSEPORT balancing is Linux")


class WorkersServer:
    """``migratory serve`` with ``Workers = n``; stdout read by a thread."""

    def __init__(
        self,
        tmp_path: Path,
        workers: int = 2,
        config: Path | None = None,
        ready: bool = True,
        env: dict[str, str] | None = None,
        **settings: str,
    ) -> None:
        """``ready``: wait for the server's ``listening`` line and its workers' pids;
        ``env``: more environment variables (for the supervisor and its workers)."""
        args = [sys.executable, "-m", "cluster", "serve", "--set", "Listen=127.0.0.1:0",
                "--set", f"Workers={workers}"]
        if config is not None:
            args += ["--config", str(config)]
        for key, value in settings.items():
            args += ["--set", f"{key}={value}"]
        self.log_path = tmp_path / f"workers-{time.monotonic_ns()}.log"
        self._log = self.log_path.open("wb")
        environment = {k: v for k, v in os.environ.items() if not k.startswith("MIGRATORY_CFG_")}
        environment.update(env or {})
        # its own session, as a server started from a terminal: a signal to pytest's group
        # never reaches it, and its workers stop only through it
        # and it dies with pytest even when pytest is killed (leftovers seen: supervisors
        # and their workers running on, orphaned, after a timed-out run)
        self.proc = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=self._log,
                                     env=environment, start_new_session=True,
                                     preexec_fn=lambda: die_with_parent(signal.SIGINT))
        self.lines: queue.Queue[str] = queue.Queue()
        self.pids: dict[int, int] = {}  # worker index -> pid (the latest started)
        self.monitoring: list[str] = []  # with MonitorListen: one URL per worker
        self.listening: list[str] = []  # one URL per client listener
        threading.Thread(target=self._read, daemon=True).start()
        if ready:
            self._wait_ready(workers)

    def _wait_ready(self, workers: int) -> None:
        deadline = time.monotonic() + 60
        first = self.lines.get(timeout=60)  # as from a single server: "listening" first
        assert first.startswith("listening ws://"), first
        self.port = int(first.rsplit(":", 1)[1])
        while len(self.pids) < workers:  # then the workers' pids
            self.lines.get(timeout=max(0.1, deadline - time.monotonic()))
        for index, url in enumerate(self.monitoring):  # (MonitorListen) line i: worker i
            answer = json.loads(urllib.request.urlopen(f"{url}/cluster", timeout=5).read())
            assert answer["worker"] == index, f"monitoring line {index} is {answer['worker']}'s"

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for raw in self.proc.stdout:
            line = raw.decode().strip()
            if line.startswith("worker "):
                _, index, _, pid = line.split()
                self.pids[int(index)] = int(pid)
            elif line.startswith("monitoring "):
                self.monitoring.append(line.split()[1])
            elif line.startswith("listening "):
                self.listening.append(line.split()[1])
            self.lines.put(line)

    def started(self) -> list[int]:
        """The pid of every worker the supervisor logged starting (ready or not)."""
        return [int(pid) for pid in re.findall(r"worker \d+ started \(pid (\d+)\)", self.log())]

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def wait_log(self, text: str, timeout: float = 20) -> None:
        deadline = time.monotonic() + timeout
        while text not in self.log():
            assert time.monotonic() < deadline, f"{text!r} not logged:\n{self.log()[-3000:]}"
            time.sleep(0.05)

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGINT)
            try:
                self.proc.wait(15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(5)
        for pid in {*self.pids.values(), *self.started()}:  # never leave a worker behind
            if alive(pid):
                os.kill(pid, signal.SIGKILL)
        self._log.close()


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


@pytest.fixture
def server(tmp_path: Path) -> Iterator[WorkersServer]:
    started = WorkersServer(tmp_path, MonitorListen="127.0.0.1:0")
    try:
        yield started
    finally:
        started.stop()
        print(started.log()[-4000:])


def connect(port: int, name: str, timeout: float = 10) -> tuple[RawClient, str]:
    """A connected client and the server name (worker) that answered; a worker not ready
    yet closes with 1013, one just killed resets: the client tries again."""
    deadline = time.monotonic() + timeout
    while True:
        assert time.monotonic() < deadline, "no worker took the client"
        try:
            client = RawClient(port, timeout=5)
            client.send_op(ops.Connect(client=name))
            event = client.recv_event()
        except (OSError, AssertionError):  # reset by a dying worker, closed in the handshake
            time.sleep(0.05)
            continue
        if hasattr(event, "data"):
            reply = ops.decode_server_op(event.data)
            assert isinstance(reply, ops.Connected), reply
            return client, reply.server
        client.close()
        assert getattr(event, "code", None) == close_codes.TRY_AGAIN_LATER.code, event
        time.sleep(0.05)


def clients_on_every_worker(port: int, workers: int, per_worker: int) -> dict[str, list[RawClient]]:
    """Connect until every worker serves ``per_worker`` clients (the kernel spreads them)."""
    on: dict[str, list[RawClient]] = {}
    for attempt in range(200):
        client, worker = connect(port, f"c{attempt}")
        if len(on.setdefault(worker, [])) < per_worker:
            on[worker].append(client)
        else:
            client.close()
        if len(on) == workers and all(len(c) == per_worker for c in on.values()):
            return on
    raise AssertionError(f"connections did not reach every worker: {sorted(on)}")


def test_messages_published_on_any_worker_reach_every_worker_with_one_position(
    server: WorkersServer,
) -> None:
    on = clients_on_every_worker(server.port, workers=2, per_worker=3)
    assert sorted(on) == ["migratory-worker-0", "migratory-worker-1"]
    subscribers = [c for clients in on.values() for c in clients[:2]]
    for client in subscribers:
        client.subscribe(SUBJECT)
        client.recv_ops_until_status(ops.Status.SUBSCRIBE_ALLOW, timeout=10)
    publishers = [on[name][2] for name in sorted(on)]  # one on each worker
    acked: list[Position] = []
    for i in range(20):
        status = publishers[i % 2].publish(Message(SUBJECT, f"m{i}".encode(), closure=str(i)))
        assert status.status is ops.Status.PUBLISH_OK, status
        assert status.position is not None
        acked.append(status.position)
    epochs = {p.epoch for p in acked}
    assert len(epochs) == 1 and [p.seq for p in acked] == list(range(1, 21))
    for client in subscribers:
        got = updates(client, 20)
        assert [m.content for m in got] == [f"m{i}".encode() for i in range(20)]
        assert [m.position for m in got] == acked, "a worker numbered on its own"
    # each worker answers on its own monitoring port: both applied the same stream
    statuses = [json.loads(urllib.request.urlopen(f"{url}/cluster", timeout=5).read())
                for url in server.monitoring]
    assert sorted(s["worker"] for s in statuses) == [0, 1]
    assert len({s["applied_clsn"] for s in statuses}) == 1 and statuses[0]["applied_clsn"] > 0
    assert "Traceback" not in server.log()


def test_a_killed_worker_is_restarted_and_its_client_resumes_on_another_with_data_sync(
    server: WorkersServer,
) -> None:
    on = clients_on_every_worker(server.port, workers=2, per_worker=1)
    victim_name = "migratory-worker-1"
    subscriber, publisher = on[victim_name][0], on["migratory-worker-0"][0]
    subscriber.subscribe(SUBJECT)
    subscriber.recv_ops_until_status(ops.Status.SUBSCRIBE_ALLOW, timeout=10)
    acked: list[tuple[bytes, Position]] = []

    def publish(i: int) -> None:
        status = publisher.publish(Message(SUBJECT, f"m{i}".encode(), closure=str(i)))
        assert status.status is ops.Status.PUBLISH_OK, status
        assert status.position is not None
        acked.append((f"m{i}".encode(), status.position))

    for i in range(10):
        publish(i)
    seen = updates(subscriber, 10)
    last = seen[-1].position
    victim = server.pids[1]
    os.kill(victim, signal.SIGKILL)
    for i in range(10, 30):  # published while the subscriber is away
        publish(i)
    resumed, worker = connect(server.port, "resumed")
    resumed.send_op(ops.Subscribe((ops.SubscriptionRequest(SUBJECT, position=last),)))
    got = resumed.recv_ops_until_status(ops.Status.DATA_SYNC, timeout=10)
    statuses = [op.status for op in got if isinstance(op, ops.SubjectStatus)]
    assert ops.Status.DATA_RESYNC not in statuses, statuses
    recovered = delivered(got)
    assert all(m.type is MessageType.RECOVERED for m in recovered), recovered
    for i in range(30, 35):  # and live after it
        publish(i)
    later = updates(resumed, 35 - 10 - len(recovered))
    positions = [m.position for m in seen + recovered + later]
    assert positions == [p for _, p in acked], "gap or duplicate across the worker crash"
    assert [m.content for m in seen + recovered + later] == [c for c, _ in acked]
    server.wait_log("worker 1 stopped (signal SIGKILL); restarting it")
    server.wait_log("worker 1 is back")
    assert server.pids[1] != victim and alive(server.pids[1])
    print("resumed on", worker)


def test_a_second_server_is_refused_the_port_of_a_running_one(server: WorkersServer) -> None:
    """SO_REUSEPORT lets any process of the same user join a port's listeners: a second
    server with workers on the port of a running one would start, and the kernel would
    split the clients between two servers that never see each other's messages."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("MIGRATORY_CFG_")}
    second = subprocess.run(
        [sys.executable, "-m", "cluster", "serve", "--set", f"Listen=127.0.0.1:{server.port}",
         "--set", "Workers=2"], capture_output=True, env=env, timeout=30,
    )
    assert second.returncode == 1, second.stdout.decode()
    assert (f"cannot listen on 127.0.0.1:{server.port} (Listen): Address already in use"
            in second.stderr.decode()), second.stderr.decode()
    _, worker = connect(server.port, "after")  # the first one serves on
    assert worker.startswith("migratory-worker-")


def test_a_restarted_worker_runs_with_the_configuration_the_server_started_with(
    tmp_path: Path,
) -> None:
    """The config file edited (here: broken) while the server runs: a worker restarted
    then runs as its peers and the sequencer do, with the file as the server read it --
    not with settings nobody else read, nor in a restart loop on a file it refuses."""
    path = tmp_path / "migratory.conf"
    path.write_text("ServerName = edge\n")
    server = WorkersServer(tmp_path, config=path)
    try:
        path.write_text("ServerName = edited\nNoSuchKey = 1\n")
        os.kill(server.pids[1], signal.SIGKILL)
        server.wait_log("worker 1 is back")
        assert "configuration error" not in server.log()
        on = clients_on_every_worker(server.port, workers=2, per_worker=1)
        assert sorted(on) == ["edge-worker-0", "edge-worker-1"]
    finally:
        server.stop()


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM])
def test_a_signal_to_the_supervisor_stops_every_worker(tmp_path: Path, sig: int) -> None:
    server = WorkersServer(tmp_path, workers=2, DrainTime="2")
    try:
        client, _ = connect(server.port, "c")
        workers = list(server.pids.values())
        server.proc.send_signal(sig)
        # the client is told, as by a single server: going away (SIGINT) or drained (SIGTERM)
        expected = close_codes.GOING_AWAY if sig == signal.SIGINT else close_codes.DRAINED
        assert client.recv_close(timeout=30).code == expected.code
        assert server.proc.wait(30) == 0  # cleanly; the 30 s only guard against a hang
        assert not any(alive(pid) for pid in workers), "a worker outlived its supervisor"
        assert "stopped: 2 workers" in server.log()
        client.close()
    finally:
        server.stop()


def test_a_signal_during_start_up_stops_the_server_at_once(tmp_path: Path) -> None:
    """Ctrl-C while the workers are still starting (held here with SIGSTOP, as on a
    machine too busy to run them): the supervisor acts on it then, not once they are
    ready; it never says ``listening``, and no worker outlives it or logs a traceback."""
    server = WorkersServer(tmp_path, workers=2, ready=False)
    try:
        for index in (0, 1):
            server.wait_log(f"worker {index} started (pid ")
        workers = server.started()
        for pid in workers:
            os.kill(pid, signal.SIGSTOP)
        server.proc.send_signal(signal.SIGINT)
        server.wait_log("SIGINT received during start-up: stopping 2 workers")
        for pid in workers:  # (SIGTERM's default action may have ended it, stopped)
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGCONT)
        assert server.proc.wait(15) == 0
        assert not any(alive(pid) for pid in workers), "a worker outlived its supervisor"
        lines = list(server.lines.queue)
        assert not [line for line in lines if line.startswith("listening")], lines
        assert "Traceback" not in server.log()
        assert "stopped: 2 workers" in server.log()
    finally:
        server.stop()


@pytest.mark.parametrize("when", ["serving", "starting", "frozen"])
def test_workers_stop_when_their_supervisor_is_killed(tmp_path: Path, when: str) -> None:
    """Killed while they serve, or while they are still starting: a worker that asked
    for its parent only once the supervisor was gone watched init and ran on, orphaned,
    holding the port. Frozen: a worker held with SIGSTOP when its supervisor was killed
    stayed stopped for ever, an orphan whose listening socket still took 1/N of the new
    connections (unanswered) and kept a new server off the port; it is continued."""
    server = WorkersServer(tmp_path, workers=2, ready=when != "starting")
    try:
        if when == "starting":
            server.wait_log("worker 1 started (pid ")
            server.wait_log("worker 0 started (pid ")
        workers = server.started()
        assert len(workers) == 2
        if when == "frozen":
            os.kill(server.pids[0], signal.SIGSTOP)
        server.proc.kill()
        server.proc.wait(5)
        deadline = time.monotonic() + 10
        while any(alive(pid) for pid in workers):
            assert time.monotonic() < deadline, "orphaned workers kept the port"
            time.sleep(0.1)
    finally:
        server.stop()


class ReconnectingPublisher(threading.Thread):
    """Publishes numbered messages through the shared port until stopped, reconnecting
    when its worker dies; a publish whose reply was lost is recorded as unknown."""

    def __init__(self, port: int) -> None:
        super().__init__(daemon=True)
        self.port = port
        self.stop = threading.Event()
        self.acked: list[tuple[bytes, Position]] = []
        self.unknown: list[bytes] = []
        self.error: BaseException | None = None

    def run(self) -> None:
        try:
            self._publish()
        except BaseException as exc:  # the test fails on it, not on a silent thread
            self.error = exc
            raise

    def _publish(self) -> None:
        client, _ = connect(self.port, "publisher")
        for i in range(3000):
            if self.stop.is_set():
                break
            content = f"m{i:04d}".encode()
            try:
                status = client.publish(Message(SUBJECT, content, closure=str(i)))
            except (OSError, AssertionError):  # the worker died under it
                self.unknown.append(content)
                client.close()
                client, _ = connect(self.port, "publisher")
                continue
            assert status.status is ops.Status.PUBLISH_OK, status
            assert status.position is not None
            self.acked.append((content, status.position))
            time.sleep(0.01)
        client.close()


def test_the_sdk_survives_the_crash_of_its_worker_and_resumes_without_gap(
    server: WorkersServer,
) -> None:
    """Each worker SIGKILLed in turn while publishing goes on (so one of them is the SDK
    subscriber's): the SDK reconnects through the same port and resumes with DATA_SYNC;
    every numbered message arrives once, in order (contiguous seqs), every acknowledged
    one among them."""
    import trio

    from migratory_client import NotificationStatus, ReconnectPolicy
    from migratory_client import connect as sdk_connect

    fast = ReconnectPolicy(initial_delay=0.05, max_delay=0.2, connect_timeout=3.0)
    publisher = ReconnectingPublisher(server.port)
    received: list[Message] = []
    statuses: list[NotificationStatus] = []

    def kill(worker: int) -> None:
        print(f"killing worker {worker} (pid {server.pids[worker]}) after {len(received)} "
              f"messages; SDK events so far {statuses}")
        os.kill(server.pids[worker], signal.SIGKILL)

    async def main() -> None:
        async with (
            sdk_connect([f"ws://127.0.0.1:{server.port}"], reconnect=fast) as client,
            client.subscribe(SUBJECT) as subscription,
        ):

            async def notes() -> None:
                async for note in client.notifications():
                    statuses.append(note.status)

            async with trio.open_nursery() as nursery:
                nursery.start_soon(notes)
                await client.wait_connected()
                await trio.sleep(0.3)
                publisher.start()
                first_killed = False
                second_kill_at: int | None = None
                with trio.fail_after(60):
                    while publisher.is_alive() or not {c for c, _ in publisher.acked} <= {
                        m.content for m in received
                    }:
                        with trio.move_on_after(0.2):
                            received.append(await subscription.__anext__())
                        if not first_killed and len(received) >= 30:
                            first_killed = True
                            kill(0)
                        elif (first_killed and second_kill_at is None
                              and "worker 0 is back" in server.log()):
                            second_kill_at = len(received)
                            kill(1)  # worker 0 is back: the SDK has a worker to go to
                        elif second_kill_at is not None and len(received) >= second_kill_at + 40:
                            publisher.stop.set()
                nursery.cancel_scope.cancel()

    trio.run(main)
    publisher.join(10)
    assert publisher.error is None, repr(publisher.error)
    seqs = [m.seq for m in received]
    print("received", len(received), "statuses", statuses, "unknown", publisher.unknown)
    assert seqs == list(range(seqs[0], seqs[0] + len(seqs))), "gap or duplicate"
    assert len({m.epoch for m in received}) == 1
    by_content = {m.content: m.position for m in received}
    for content, position in publisher.acked:
        assert by_content.get(content) == position, f"acknowledged {content!r} lost"
    assert NotificationStatus.SERVER_DOWN in statuses
    assert NotificationStatus.DATA_SYNC in statuses
    assert NotificationStatus.DATA_RESYNC not in statuses
    server.wait_log("worker 1 is back")
