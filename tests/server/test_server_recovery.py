"""Over real loopback sockets against a real server process: recovery semantics."""

from __future__ import annotations

from typing import Any

from rawclient import RawClient, delivered

from migratory.model.message import Message, MessageType
from migratory.model.position import Position
from migratory.protocol import ops

SUBJECT = "/Stocks/NYSE/IBM"


def _publisher(port: int) -> RawClient:
    client = RawClient(port)
    client.connect("publisher")
    return client


def _publish_n(publisher: RawClient, start: int, count: int) -> list[ops.PublishStatus]:
    return [
        publisher.publish(Message(SUBJECT, f"m{i}".encode(), retained=True, closure=f"c{i}"))
        for i in range(start, start + count)
    ]


def test_subscriber_drop_then_resume_gets_exactly_the_missed_then_data_sync(
    start_server: Any,
) -> None:
    server = start_server(BatchTime="0")
    publisher = _publisher(server.port)
    _publish_n(publisher, 0, 3)

    subscriber = RawClient(server.port)
    subscriber.connect("sub")
    subscriber.subscribe(SUBJECT)
    allow = subscriber.recv_op()
    assert isinstance(allow, ops.SubjectStatus) and allow.status is ops.Status.SUBSCRIBE_ALLOW
    assert allow.position is not None and allow.position.seq == 3
    (snapshot,) = subscriber.recv_messages(1)
    assert snapshot.type is MessageType.SNAPSHOT and snapshot.content == b"m2"
    live = _publish_n(publisher, 3, 2)
    got = subscriber.recv_messages(2)
    assert [(m.seq, m.type) for m in got] == [(4, MessageType.UPDATE), (5, MessageType.UPDATE)]
    last = Position(got[-1].epoch, got[-1].seq)
    assert live[-1].position == last
    subscriber.close()  # drops without a goodbye

    missed = _publish_n(publisher, 5, 4)
    resumed = RawClient(server.port)
    resumed.connect("sub-again")
    resumed.subscribe(SUBJECT, position=last)
    received = resumed.recv_ops_until_status(ops.Status.DATA_SYNC)
    messages = delivered(received)
    assert [m.content for m in messages] == [b"m5", b"m6", b"m7", b"m8"]
    assert {m.type for m in messages} == {MessageType.RECOVERED}
    assert [m.position for m in messages] == [s.position for s in missed]
    assert received[-1] == ops.SubjectStatus(
        ops.Status.DATA_SYNC, SUBJECT, missed[-1].position
    )
    # and live again afterwards, with no duplicate in between
    _publish_n(publisher, 9, 1)
    (after,) = resumed.recv_messages(1)
    assert (after.seq, after.type) == (10, MessageType.UPDATE)


def test_resume_beyond_cache_gets_snapshot_then_data_resync(start_server: Any) -> None:
    server = start_server(MaxCachedMessagesPerSubject="3", BatchTime="0")
    publisher = _publisher(server.port)
    first = _publish_n(publisher, 0, 2)
    _publish_n(publisher, 2, 6)  # seq 3..8; the cache keeps 6..8
    client = RawClient(server.port)
    client.connect()
    client.subscribe(SUBJECT, position=first[-1].position)  # last seen seq 2
    received = client.recv_ops_until_status(ops.Status.DATA_RESYNC)
    (snapshot,) = delivered(received)
    assert snapshot.type is MessageType.SNAPSHOT and snapshot.content == b"m7"
    assert received[-1].position == Position(first[0].position.epoch, 8)  # type: ignore[union-attr]


def test_history_returns_last_n_messages(start_server: Any) -> None:
    server = start_server(BatchTime="0")
    publisher = _publisher(server.port)
    _publish_n(publisher, 0, 5)
    client = RawClient(server.port)
    client.connect()
    client.subscribe(SUBJECT, history=3)
    client.recv_op()  # SUBSCRIBE_ALLOW
    history = client.recv_messages(3)
    assert [(m.content, m.type) for m in history] == [
        (b"m2", MessageType.HISTORICAL),
        (b"m3", MessageType.HISTORICAL),
        (b"m4", MessageType.HISTORICAL),
    ]


def test_restarted_server_has_a_new_epoch_so_resume_is_data_resync(start_server: Any) -> None:
    server = start_server(BatchTime="0")
    publisher = _publisher(server.port)
    old = _publish_n(publisher, 0, 2)[-1].position
    assert old is not None
    publisher.close()
    assert server.stop() == 0

    restarted = start_server(BatchTime="0")
    publisher = _publisher(restarted.port)
    new = _publish_n(publisher, 10, 1)[-1].position
    assert new is not None and new.epoch != old.epoch and new.seq == 1
    client = RawClient(restarted.port)
    client.connect()
    client.subscribe(SUBJECT, position=old)
    received = client.recv_ops_until_status(ops.Status.DATA_RESYNC)
    assert [m.content for m in delivered(received)] == [b"m10"]
    assert received[-1].position == new  # type: ignore[union-attr]
