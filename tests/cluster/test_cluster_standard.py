"""Standard mode with real member processes: publications are forwarded to every
member; after failover a client gets the snapshot and DATA_RESYNC (seed semantics)."""

from __future__ import annotations

import json
import signal
import sys
import threading
import time
import urllib.request
from pathlib import Path

from cluster_fixture import LocalCluster
from tcp_gate import TcpGate

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "server"))
from rawclient import RawClient, delivered

from migratory.model.message import Message, MessageType
from migratory.protocol import ops

SUBJECT = "/Stocks/NYSE/IBM"


def test_standard_mode_forwards_and_failover_gives_snapshot_and_resync(tmp_path: Path) -> None:
    cluster = LocalCluster(tmp_path, members=2, mode="Standard")
    cluster.start_all()
    try:
        cluster.wait_ready()
        deadline = time.monotonic() + 10
        while len(cluster.status(0)["forwarding_to"]) < 1 and time.monotonic() < deadline:
            time.sleep(0.05)
        on_b = RawClient(cluster.port(1))
        on_b.connect("sub-b")
        on_b.subscribe(SUBJECT)
        assert isinstance(on_b.recv_op(), ops.SubjectStatus)
        on_a = RawClient(cluster.port(0))
        on_a.connect("sub-a")
        on_a.subscribe(SUBJECT)
        assert isinstance(on_a.recv_op(), ops.SubjectStatus)
        publisher = RawClient(cluster.port(0))
        publisher.connect("pub")
        for i in range(3):
            status = publisher.publish(Message(SUBJECT, f"{190 + i}".encode(), retained=True,
                                               closure=str(i)))
            assert status.status is ops.Status.PUBLISH_OK
        forwarded = on_b.recv_messages(3)
        assert [m.content for m in forwarded] == [b"190", b"191", b"192"]
        seen_on_a = on_a.recv_messages(3)
        cluster.kill(0)
        on_b.subscribe(SUBJECT, position=seen_on_a[-1].position)  # failover from A to B
        received = on_b.recv_ops_until_status(ops.Status.DATA_RESYNC)
        (snapshot,) = delivered(received)
        assert (snapshot.type, snapshot.content) == (MessageType.SNAPSHOT, b"192")
    finally:
        cluster.stop()


def _forwarding(cluster: LocalCluster, members: list[int]) -> None:
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        if all(cluster.status(i)["forwarding_to"] for i in members):
            return
        time.sleep(0.05)
    raise TimeoutError("members not forwarding to each other")


def test_forwards_dropped_while_a_member_stalls_are_announced_to_its_subscribers(
    tmp_path: Path,
) -> None:
    """A's queue towards a stopped B overflows (forwards dropped, counted there); B's
    subscriber must not see the messages after the hole as if nothing were missing: it is
    told DATA_RESYNC (with the snapshot) before them, positions never go back or repeat."""
    cluster = LocalCluster(tmp_path, members=2, mode="Standard")
    cluster.start_all()
    try:
        cluster.wait_ready()
        _forwarding(cluster, [0])
        on_b = RawClient(cluster.port(1))
        on_b.connect("sub-b")
        on_b.subscribe(SUBJECT)
        assert isinstance(on_b.recv_op(), ops.SubjectStatus)
        publisher = RawClient(cluster.port(0))
        publisher.connect("pub")
        first = publisher.publish(Message(SUBJECT, b"first", {"a": "1"}, retained=True,
                                          closure="first"))
        assert first.status is ops.Status.PUBLISH_OK
        (seen,) = on_b.recv_messages(1)
        assert seen.content == b"first"
        stalled = cluster.processes[1]
        assert stalled is not None
        stalled.send_signal(signal.SIGSTOP)
        try:
            padding = b"x" * 8192
            for i in range(4000):  # until A drops a forward (its queue + the socket buffers)
                status = publisher.publish(Message(SUBJECT, padding, {"n": str(i)},
                                                   retained=True, closure=str(i)))
                assert status.status is ops.Status.PUBLISH_OK
                if i % 50 == 49 and cluster.status(0)["forward_dropped"]:
                    break
            assert cluster.status(0)["forward_dropped"] > 0
        finally:
            stalled.send_signal(signal.SIGCONT)
        last = publisher.publish(Message(SUBJECT, b"last", retained=True, closure="last"))
        assert last.status is ops.Status.PUBLISH_OK
        received: list[ops.ServerOp] = []
        for _ in range(10_000):  # until "last" comes (or nothing more does: the loss)
            try:
                op = on_b.recv_op(timeout=10)
            except TimeoutError:
                break
            received.append(op)
            if isinstance(op, ops.Deliver) and op.messages[-1].content == b"last":
                break
        resyncs = [i for i, op in enumerate(received)
                   if isinstance(op, ops.SubjectStatus) and op.status is ops.Status.DATA_RESYNC]
        assert resyncs, "B's subscriber missed forwards without being told"
        positions = [(m.epoch, m.seq) for m in delivered(received)
                     if m.type is not MessageType.SNAPSHOT]
        assert len(set(positions)) == len(positions)
        assert delivered(received)[-1].content == b"last"  # the newest, even if dropped
        assert cluster.status(1)["forward_gaps"] >= 1
        snapshot = next(m for m in delivered(received[: resyncs[0]])[::-1])
        assert snapshot.type is MessageType.SNAPSHOT and snapshot.fields["a"] == "1"
    finally:
        cluster.stop()


def _unannounced(received: list[ops.ServerOp], published: list[bytes]) -> list[bytes]:
    """The updates that skip some of ``published`` with no DATA_RESYNC since the last
    update (or that come twice, or out of order)."""
    wrong, after, announced = [], 0, False
    for op in received:
        if isinstance(op, ops.SubjectStatus) and op.status is ops.Status.DATA_RESYNC:
            announced = True
        elif isinstance(op, ops.Deliver):
            for message in op.messages:
                if message.type is MessageType.SNAPSHOT:
                    continue
                index = published.index(message.content)
                if index < after or (index > after and not announced):
                    wrong.append(message.content)
                after, announced = index + 1, False
    return wrong


def gated_pair(tmp_path: Path, *, mqtt: bool = False) -> tuple[LocalCluster, TcpGate, int]:
    """Two Standard members started, B's link port (its ClusterMemberListen) behind a
    :class:`TcpGate`: the cluster, the gate and that port (``mqtt``: each member's MQTT
    listener on its port + 5)."""
    cluster = LocalCluster(tmp_path, members=2, mode="Standard")
    for i, settings in enumerate(cluster.settings if mqtt else ()):
        settings["ListenMqtt"] = f"127.0.0.1:{cluster.port(i) + 5}"
    listen = int(cluster.settings[1]["ClusterMemberListen"].rsplit(":", 1)[1])
    bind = cluster.base + 2000
    cluster.settings[1]["ClusterMemberBind"] = f"127.0.0.1:{bind}"
    gate = TcpGate(listen, bind)
    cluster.start_all()
    return cluster, gate, listen


def receive_until(client: RawClient, content: bytes) -> list[ops.ServerOp]:
    """What ``client`` receives until a delivery of ``content`` (or nothing for 10 s)."""
    received: list[ops.ServerOp] = []
    for _ in range(100):
        try:
            op = client.recv_op(timeout=10)
        except TimeoutError:
            break
        received.append(op)
        if isinstance(op, ops.Deliver) and op.messages[-1].content == content:
            break
    return received


def test_forwards_lost_with_a_link_reset_while_both_members_stay_up_are_announced(
    tmp_path: Path,
) -> None:
    """The link from A to B held, then reset (what it carried is lost), while A, B and
    B's own link to A stay up, and nothing is published after: B's subscriber gets
    DATA_RESYNC and the newest message (A, idle, learns of the reset from the link, not
    from a next forward), every message or DATA_RESYNC before the first after the hole."""
    cluster, gate, listen = gated_pair(tmp_path)
    try:
        cluster.wait_ready()
        _forwarding(cluster, [0, 1])
        on_b = RawClient(cluster.port(1))
        on_b.connect("sub-b")
        on_b.subscribe(SUBJECT)
        assert isinstance(on_b.recv_op(), ops.SubjectStatus)
        publisher = RawClient(cluster.port(0))
        publisher.connect("pub")
        published = [f"m{i}".encode() for i in range(1, 4)]

        def publish(content: bytes) -> None:
            status = publisher.publish(Message(SUBJECT, content, {content.decode(): "1"},
                                               retained=True, closure=content.decode()))
            assert status.status is ops.Status.PUBLISH_OK

        publish(published[0])
        received = [on_b.recv_op()]
        gate.hold()
        publish(published[1])
        publish(published[2])
        deadline = time.monotonic() + 10  # until A wrote both into the held link
        while cluster.status(0)["forward_queued"][f"127.0.0.1:{listen}"] and (
                time.monotonic() < deadline):
            time.sleep(0.05)
        assert gate.close_gate(reset_open=True) >= 1  # (the agreement probe may be one)
        gate.release(settle=0)
        gate.open_gate()
        received += receive_until(on_b, published[-1])
        assert delivered(received)[-1].content == published[-1], received
        assert _unannounced(received, published) == [], received
    finally:
        cluster.stop()
        gate.shutdown()


def test_two_publishers_on_two_members_at_once_positions_never_given_twice(
    tmp_path: Path,
) -> None:
    """Each member numbers every message of the subject once, contiguously, in its own
    epoch (so no position names two messages across members either); each publisher's
    messages keep their order everywhere; the members' orders may differ (Standard agrees
    on none), the snapshots' fields merge to the same values."""
    cluster = LocalCluster(tmp_path, members=2, mode="Standard")
    cluster.start_all()
    try:
        cluster.wait_ready()
        _forwarding(cluster, [0, 1])
        subscribers = []
        for i in (0, 1):
            subscriber = RawClient(cluster.port(i))
            subscriber.connect(f"sub-{i}")
            subscriber.subscribe(SUBJECT)
            assert isinstance(subscriber.recv_op(), ops.SubjectStatus)
            subscribers.append(subscriber)
        count = 200

        def publish(index: int, name: str) -> None:
            publisher = RawClient(cluster.port(index))
            publisher.connect(f"pub-{name}")
            for n in range(count):
                status = publisher.publish(Message(SUBJECT, f"{name}{n:03d}".encode(),
                                                   {name: str(n)}, retained=True,
                                                   closure=str(n)))
                assert status.status is ops.Status.PUBLISH_OK

        threads = [threading.Thread(target=publish, args=(i, name))
                   for i, name in ((0, "a"), (1, "b"))]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(60)
        orders = []
        for i, subscriber in enumerate(subscribers):
            got = subscriber.recv_messages(2 * count)
            epochs = {m.epoch for m in got}
            assert epochs == {cluster.status(i)["epoch"]}
            assert [m.seq for m in got] == list(range(1, 2 * count + 1))
            contents = [m.content.decode() for m in got]
            for name in "ab":
                assert [c for c in contents if c[0] == name] == [
                    f"{name}{n:03d}" for n in range(count)]
            orders.append(contents)
        assert cluster.status(0)["epoch"] != cluster.status(1)["epoch"]
        snapshots = []
        for i in (0, 1):
            url = f"{cluster.http(i)}/snapshot?subject={SUBJECT}&format=json"
            with urllib.request.urlopen(url, timeout=2) as reply:
                snapshots.append(json.loads(reply.read()))
        print(f"orders differ at {sum(a != b for a, b in zip(*orders, strict=True))} of "
              f"{2 * count} positions; last retained {[s.get('content') for s in snapshots]}")
        assert [s["fields"] for s in snapshots] == [{"a": "199", "b": "199"}] * 2
        assert all(s["forward_gaps"] == 0 for s in map(cluster.status, (0, 1)))
    finally:
        cluster.stop()
