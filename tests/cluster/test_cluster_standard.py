"""Standard mode with real member processes: publications are forwarded to every
member; after failover a client gets the snapshot and DATA_RESYNC (seed semantics)."""

from __future__ import annotations

import sys
import time
from pathlib import Path

from cluster_fixture import LocalCluster

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
