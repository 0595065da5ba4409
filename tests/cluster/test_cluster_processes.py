"""Guaranteed cluster with real member processes: SIGKILL the leader, the subscriber's
member and a non-seed while publishing; nothing acknowledged is lost or duplicated."""

from __future__ import annotations

import signal
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from cluster_fixture import LocalCluster

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "server"))
from rawclient import RawClient, delivered

from migratory.model.message import Message, MessageType
from migratory.model.position import Position
from migratory.protocol import ops

SUBJECT = "/Scores/NBA/LAL"


@pytest.fixture
def cluster4(tmp_path: Path) -> Any:
    cluster = LocalCluster(tmp_path, members=4, seeds=3)
    cluster.start_all()
    try:
        cluster.wait_ready()
        yield cluster
    finally:
        cluster.stop()


def subscriber(cluster: LocalCluster, index: int, **kw: Any) -> RawClient:
    client = RawClient(cluster.port(index))
    client.connect(f"sub-{index}")
    client.subscribe(SUBJECT, **kw)
    return client


def publish(client: RawClient, content: bytes, closure: str) -> ops.PublishStatus:
    return client.publish(Message(SUBJECT, content, retained=True, closure=closure))


class Publisher(threading.Thread):
    """Publishes numbered messages through one member, recording every acknowledgement.

    A connection its member ends (a close frame, a reset, no answer in time) ends the
    thread, the reason kept in ``ended``: raised by :meth:`finish`, in the test. Let out of
    ``run`` it was an exception nobody handled, which pytest reports as a warning under
    whichever test runs at that moment."""

    def __init__(self, cluster: LocalCluster, index: int, count: int, pause: float) -> None:
        client = RawClient(cluster.port(index), timeout=15)
        client.connect("publisher")
        self._setup(client, count, pause)

    @classmethod
    def through(cls, client: RawClient, count: int, pause: float) -> Publisher:
        """A publisher on a connection made already."""
        publisher = cls.__new__(cls)
        publisher._setup(client, count, pause)
        return publisher

    def _setup(self, client: RawClient, count: int, pause: float) -> None:
        super().__init__(daemon=True, name="publisher")
        self.client = client
        self.count, self.pause = count, pause
        self.acked: list[tuple[bytes, Position]] = []
        self.failed: list[tuple[bytes, str | None]] = []
        self.ended: str | None = None
        """Why the connection ended before every publish was answered."""

    def run(self) -> None:
        for i in range(self.count):
            content = f"m{i:05d}".encode()
            try:
                status = publish(self.client, content, str(i))
            except Exception as exc:  # the close frame, a reset, timed out; or else:
                self.ended = repr(exc)  # all raised by finish, in the test
                return
            if status.status is ops.Status.PUBLISH_OK:
                if status.position is None:
                    self.ended = f"PUBLISH_OK without a position: {status}"
                    return
                self.acked.append((content, status.position))
            else:
                self.failed.append((content, status.reason))
            time.sleep(self.pause)

    def finish(self, timeout: float) -> None:
        """Wait for the last answer; an AssertionError if the thread still runs or its
        connection ended."""
        self.join(timeout)
        answered = len(self.acked) + len(self.failed)
        assert not self.is_alive(), f"publisher still publishing after {timeout} s: " \
            f"{answered} of {self.count} answered"
        assert self.ended is None, f"publisher ended after {answered} of {self.count}: " \
            f"{self.ended}"


class Background(threading.Thread):
    """``call(*args)`` in a thread (a member killed while the test reads), its end told
    into the test: :meth:`finish` joins it and raises what it raised, or that it still
    runs. A bare ``threading.Thread(target=cluster.kill)`` left an exception of the kill
    (a member that would not die in time) to threading.excepthook: a warning under
    whichever test ran then, and the test carried on as if the kill had happened."""

    def __init__(self, call: Callable[..., object], *args: object) -> None:
        super().__init__(daemon=True, name=f"background-{getattr(call, '__name__', call)}")
        self.call, self.args = call, args
        self.ended: str | None = None
        """What the call raised."""

    def run(self) -> None:
        try:
            self.call(*self.args)
        except BaseException as exc:  # told by finish, in the test
            self.ended = repr(exc)

    def finish(self, timeout: float) -> None:
        self.join(timeout)
        assert not self.is_alive(), f"{self.name} still running after {timeout} s"
        assert self.ended is None, f"{self.name} failed: {self.ended}"


def test_a_background_call_tells_its_end_into_the_test(monkeypatch: pytest.MonkeyPatch) -> None:
    """What a killer thread raises reaches the test through ``finish``, not
    threading.excepthook (no cluster: a call that raises, one that returns)."""
    unhandled: list[BaseException | None] = []
    monkeypatch.setattr(threading, "excepthook", lambda args: unhandled.append(args.exc_value))

    def kill(index: int) -> None:
        raise TimeoutError(f"member {index} still running 10 s after SIGKILL")

    failing, done = Background(kill, 1), Background(time.sleep, 0)
    failing.start()
    done.start()
    with pytest.raises(AssertionError, match=r"background-kill failed: .*member 1 still"):
        failing.finish(10)
    done.finish(10)
    assert unhandled == []


class ClosingMember:
    """A member's connection that answers ``answered`` publishes, then ends as a draining
    member ends it: rawclient reads its close frame where a status was due."""

    def __init__(self, answered: int) -> None:
        self.answered = answered

    def publish(self, message: Message) -> ops.PublishStatus:
        if self.answered == 0:
            raise AssertionError("expected a binary message, got CloseReceived(code=4502, "
                                 "reason='member is draining (shutting down)')")
        self.answered -= 1
        return ops.PublishStatus(ops.Status.PUBLISH_OK, message.closure, message.subject,
                                 Position(1, 2 - self.answered))


def test_a_publisher_whose_member_ends_its_connection_says_so_and_stops(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Its thread ends with the reason kept, which ``finish`` raises where the test reads
    it -- not an exception nobody handles in a thread: pytest's
    PytestUnhandledThreadExceptionWarning, reported under whichever test ran then (a full
    run on a busy box: the browser dashboard test's publisher, still publishing past its
    join(60), met its member draining at the cluster's stop)."""
    unhandled: list[BaseException | None] = []
    monkeypatch.setattr(threading, "excepthook", lambda args: unhandled.append(args.exc_value))
    publisher = Publisher.through(ClosingMember(answered=2), count=5, pause=0)  # type: ignore[arg-type]
    publisher.start()
    publisher.join(10)
    assert unhandled == []
    assert [content for content, _ in publisher.acked] == [b"m00000", b"m00001"]
    assert publisher.ended is not None and "member is draining" in publisher.ended
    with pytest.raises(AssertionError, match=r"publisher ended after 2 of 5: .*draining"):
        publisher.finish(1)


def receive_until(client: RawClient, contents: set[bytes], timeout: float = 20) -> list[Message]:
    got: list[Message] = []
    deadline = time.monotonic() + timeout
    while not contents <= {m.content for m in got}:
        op = client.recv_op(timeout=max(0.1, deadline - time.monotonic()))
        got.extend(delivered([op]))
    return got


def assert_exactly_once_in_order(got: list[Message], acked: list[tuple[bytes, Position]]) -> None:
    updates = [m for m in got if m.type is not MessageType.SNAPSHOT]
    positions = [m.position for m in updates]
    assert len(positions) == len(set(positions)), "duplicate delivery"
    assert positions == sorted(positions), "delivered out of order"
    by_content = {m.content: m.position for m in updates}
    for content, position in acked:
        assert by_content.get(content) == position, f"acknowledged {content!r} lost"


def test_publish_anywhere_is_numbered_once_and_delivered_everywhere(cluster4: LocalCluster) -> None:
    subs = [subscriber(cluster4, i) for i in range(4)]
    for sub in subs:
        assert isinstance(sub.recv_op(), ops.SubjectStatus)
    publishers = [RawClient(cluster4.port(i)) for i in range(4)]
    for p in publishers:
        p.connect("pub")
    statuses = [publish(publishers[i % 4], f"m{i}".encode(), str(i)) for i in range(20)]
    assert all(s.status is ops.Status.PUBLISH_OK for s in statuses)
    positions = [s.position for s in statuses]
    assert [p.seq for p in positions if p] == list(range(1, 21))
    assert len({p.epoch for p in positions if p}) == 1
    orders = [[m.content for m in receive_until(sub, {b"m19"})] for sub in subs]
    assert orders[0] == [f"m{i}".encode() for i in range(20)]
    assert all(order == orders[0] for order in orders)
    assert_seeds_agree(cluster4, range(3))


def assert_seeds_agree(cluster: LocalCluster, seeds: Any) -> None:
    """The replicated state machines did not diverge (pysyncobj may truncate entries)."""
    deadline = time.monotonic() + 10
    while True:
        digests = {cluster.status(i)["coordinator_digest"] for i in seeds}
        if len(digests) == 1 or time.monotonic() > deadline:
            break
        time.sleep(0.1)
    assert len(digests) == 1, digests


def test_leader_sigkill_while_publishing_loses_no_acknowledged_message(
    cluster4: LocalCluster,
) -> None:
    leader = cluster4.leader()
    via = next(i for i in range(3) if i != leader)
    sub = subscriber(cluster4, 3)
    sub.recv_op()
    publisher = Publisher(cluster4, via, count=150, pause=0.01)
    publisher.start()
    time.sleep(0.5)
    cluster4.kill(leader)
    publisher.finish(60)
    assert len(publisher.acked) > 100
    got = receive_until(sub, {c for c, _ in publisher.acked})
    assert_exactly_once_in_order(got, publisher.acked)
    assert cluster4.leader() != leader
    assert_seeds_agree(cluster4, [i for i in range(3) if i != leader])


def test_subscriber_resumes_on_another_member_after_sigkill(cluster4: LocalCluster) -> None:
    sub = subscriber(cluster4, 1)
    sub.recv_op()
    publisher = Publisher(cluster4, 2, count=60, pause=0.01)
    publisher.start()
    time.sleep(0.2)
    before = [m for m in delivered([sub.recv_op()]) if m.type is MessageType.UPDATE]
    cluster4.kill(1)
    publisher.finish(60)
    last = before[-1].position
    resumed = subscriber(cluster4, 3, position=last)
    received = resumed.recv_ops_until_status(ops.Status.DATA_SYNC)
    recovered = delivered(received)
    assert {m.type for m in recovered} <= {MessageType.RECOVERED}
    assert_exactly_once_in_order(
        before + recovered, [(c, p) for c, p in publisher.acked if p > last]
    )


def test_non_seed_sigkill_and_restart_resyncs_before_serving(cluster4: LocalCluster) -> None:
    publisher = Publisher(cluster4, 0, count=40, pause=0.005)
    publisher.start()
    time.sleep(0.05)
    cluster4.kill(3)
    publisher.finish(30)
    cluster4.start(3)
    cluster4.wait_ready([3])
    sub = subscriber(cluster4, 3, position=Position(publisher.acked[0][1].epoch, 0))
    received = sub.recv_ops_until_status(ops.Status.DATA_SYNC)
    assert [m.content for m in delivered(received)] == [c for c, _ in publisher.acked]


def test_non_seed_joining_under_load_serves_recovery(tmp_path: Path) -> None:
    cluster = LocalCluster(tmp_path, members=4, seeds=3)
    try:
        cluster.start_all(range(3))
        cluster.wait_ready(range(3))
        publisher = Publisher(cluster, 0, count=200, pause=0.005)
        publisher.start()
        time.sleep(0.3)
        cluster.start(3)  # joins while messages keep coming
        publisher.finish(60)
        cluster.wait_ready([3])
        first = publisher.acked[0][1]
        sub = subscriber(cluster, 3, position=Position(first.epoch, 0))
        received = sub.recv_ops_until_status(ops.Status.DATA_SYNC)
        assert [m.content for m in delivered(received)] == [c for c, _ in publisher.acked]
    finally:
        cluster.stop()


def test_member_with_wrong_cluster_password_is_refused(tmp_path: Path) -> None:
    cluster = LocalCluster(tmp_path, members=4, seeds=3)
    cluster.settings[3]["ClusterPassword"] = "not-the-password"
    try:
        cluster.start_all()
        cluster.wait_ready(range(3))
        reason = cluster.wait_refused(3, "3 of the 3 seeds disagree: authentication failed: ",
                                      "cluster link refused: authentication failed: bad mac from ")
        assert not cluster.ready(3)
        assert reason.endswith("closed the link on this member's proof (a different "
                               "ClusterPassword?)"), reason
        seed_logs = "".join(cluster.log(i) for i in range(3))
        assert "cluster link refused: authentication failed: bad mac from " in seed_logs
        assert "(wrong ClusterPassword or replay)" in seed_logs
        process = cluster.processes[3]
        assert process is not None
        process.send_signal(signal.SIGTERM)  # a member the seeds refuse still stops when told
        assert process.wait(30) == 0  # cleanly; the 30 s only guard against a hang
    finally:
        cluster.stop()


def test_every_seed_sigkilled_and_restarted_keeps_what_was_acknowledged(
    cluster4: LocalCluster,
) -> None:
    """The seeds' Raft log is on disk (ClusterDataDir): a restart forgets nothing."""
    publisher = Publisher(cluster4, 3, count=30, pause=0.002)
    publisher.start()
    publisher.finish(30)
    assert len(publisher.acked) == 30
    for i in range(3):
        cluster4.kill(i)
    for i in range(3):
        cluster4.start(i)
    cluster4.wait_ready(range(3))
    assert all("Raft state in" in cluster4.log(i) for i in range(3))
    first = publisher.acked[0][1]
    sub = subscriber(cluster4, 0, position=Position(first.epoch, 0))
    received = sub.recv_ops_until_status(ops.Status.DATA_SYNC)
    assert [(m.content, m.position) for m in delivered(received)] == publisher.acked
    after = publish(connected_client(cluster4, 1), b"after-restart", "x")
    assert after.position == Position(first.epoch, 31)  # the same lineage goes on


def connected_client(cluster: LocalCluster, index: int) -> RawClient:
    client = RawClient(cluster.port(index), timeout=15)
    client.connect("publisher-after-restart")
    return client


def test_a_seed_cut_off_from_the_majority_sends_its_clients_elsewhere(
    cluster4: LocalCluster,
) -> None:
    client = RawClient(cluster4.port(2), timeout=15)
    client.connect("stranded")
    others = [cluster4.processes[0], cluster4.processes[1]]
    for process in others:
        assert process is not None
        process.send_signal(signal.SIGSTOP)
    try:
        close = client.recv_close(timeout=15)
        assert close.code == 1013
        assert "cut off from the cluster" in close.reason
        assert not cluster4.ready(2)
    finally:
        for process in others:
            assert process is not None
            process.send_signal(signal.SIGCONT)
    cluster4.wait_ready(range(3))
    assert "sent 1 clients to other members" in cluster4.log(2)
