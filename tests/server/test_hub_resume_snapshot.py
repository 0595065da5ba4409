"""A resume that asks for the snapshot as of its position (``snapshot: true``): the
answer to the client's first subscribe was cut after its SUBSCRIBE_ALLOW, before the
snapshot it owed (docs/protocol.md, "What a subscribe produces")."""

from __future__ import annotations

import cbor2
import pytest

from migratory.model.message import Message, MessageType
from migratory.model.position import Position
from migratory.protocol import ops
from migratory.protocol.websocket import FrameDecoder
from migratory.server.hub import Hub

SUBJECT = "/Stocks/NYSE/IBM"
ALLOW = ops.SubjectStatus(ops.Status.SUBSCRIBE_ALLOW, SUBJECT)


class OpSink:
    def __init__(self) -> None:
        self.frames: list[bytes] = []

    def deliver(self, frame: bytes) -> None:
        self.frames.append(frame)

    def received(self) -> list[ops.ServerOp]:
        events = FrameDecoder(client_frames=False).events(b"".join(self.frames))
        return [ops.decode_server_op(e.data) for e in events]  # type: ignore[union-attr,misc]


def publish(hub: Hub, content: str, *, retained: bool = False, **fields: str) -> None:
    hub.publish(Message(SUBJECT, content.encode(), fields, retained=retained), 0.0)


def resume(hub: Hub, position: Position, *, snapshot: bool = True) -> list[ops.ServerOp]:
    request = ops.SubscriptionRequest(SUBJECT, position, snapshot=snapshot)
    return hub.subscribe(OpSink(), request, 0.0)


def described(out: list[ops.ServerOp]) -> list[object]:
    """Each op as (type, seq) for messages, or the status with its position."""
    found: list[object] = []
    for op in out:
        if isinstance(op, ops.Deliver):
            found += [(m.type.value, m.seq) for m in op.messages]
        else:
            found.append(op)
    return found


def test_the_snapshot_as_of_the_position_comes_first_then_what_was_missed() -> None:
    hub = Hub(epoch=9)
    publish(hub, "193", retained=True, volume="6.62M")
    publish(hub, "x")  # the client's position: (9, 2), the snapshot is (9, 1)
    publish(hub, "y")
    publish(hub, "z")
    out = resume(hub, Position(9, 2))
    assert described(out) == [
        ALLOW,
        ("snapshot", 1),
        ("recovered", 3),
        ("recovered", 4),
        ops.SubjectStatus(ops.Status.DATA_SYNC, SUBJECT, Position(9, 4)),
    ]
    snapshot = out[1].messages[0]  # type: ignore[union-attr]
    assert (snapshot.content, dict(snapshot.fields)) == (b"193", {"volume": "6.62M"})


def test_without_asking_a_resume_gets_no_snapshot() -> None:
    hub = Hub(epoch=9)
    publish(hub, "193", retained=True)
    publish(hub, "x")
    assert described(resume(hub, Position(9, 1), snapshot=False)) == [
        ALLOW,
        ("recovered", 2),
        ops.SubjectStatus(ops.Status.DATA_SYNC, SUBJECT, Position(9, 2)),
    ]


def test_a_subject_without_a_snapshot_recovers_as_any_resume() -> None:
    hub = Hub(epoch=9)
    publish(hub, "x")
    publish(hub, "y")
    assert described(resume(hub, Position(9, 1))) == [
        ALLOW,
        ("recovered", 2),
        ops.SubjectStatus(ops.Status.DATA_SYNC, SUBJECT, Position(9, 2)),
    ]


def test_a_snapshot_changed_since_the_position_is_the_current_one_and_a_resync() -> None:
    """The cache no longer holds the lineage's first message: the snapshot as of the
    position (its fields merged over since) cannot be told."""
    hub = Hub(epoch=9, max_cached_messages=3)
    publish(hub, "193", retained=True, volume="6.62M")
    publish(hub, "x")  # the client's position: (9, 2)
    publish(hub, "194", retained=True)  # merged over the one the client was owed
    publish(hub, "y")  # the cache: 2..4
    assert described(resume(hub, Position(9, 2))) == [
        ALLOW,
        ("snapshot", 3),
        ops.SubjectStatus(ops.Status.DATA_RESYNC, SUBJECT, Position(9, 4)),
    ]


def test_a_snapshot_changed_since_the_position_is_rebuilt_from_a_whole_cache() -> None:
    """The cache holds the lineage from its first message: the snapshot as of the
    position is merged again from it (was: the current one and DATA_RESYNC, though
    every message after the position was there to recover)."""
    hub = Hub(epoch=9)
    publish(hub, "193", retained=True, volume="6.62M", price="193")
    publish(hub, "x")  # the client's position: (9, 2)
    publish(hub, "194", retained=True, price="194")
    out = resume(hub, Position(9, 2))
    assert described(out) == [
        ALLOW,
        ("snapshot", 1),
        ("recovered", 3),
        ops.SubjectStatus(ops.Status.DATA_SYNC, SUBJECT, Position(9, 3)),
    ]
    snapshot = out[1].messages[0]  # type: ignore[union-attr]
    assert (snapshot.content, dict(snapshot.fields)) == (
        b"193", {"volume": "6.62M", "price": "193"})


def test_no_snapshot_owed_when_nothing_retained_came_before_the_position() -> None:
    """The subject had no snapshot when the client's answer was cut (its first message
    not retained); a retained one came after. Was: the current snapshot and DATA_RESYNC
    (the cluster machine of tests/cluster found it: a DATA_RESYNC while the cache
    reaches back)."""
    hub = Hub(epoch=9)
    publish(hub, "x")  # the client's position: (9, 1), no snapshot then
    publish(hub, "193", retained=True, volume="6.62M")
    publish(hub, "y")
    assert described(resume(hub, Position(9, 1))) == [
        ALLOW,
        ("recovered", 2),
        ("recovered", 3),
        ops.SubjectStatus(ops.Status.DATA_SYNC, SUBJECT, Position(9, 3)),
    ]


def test_at_seq_0_no_snapshot_was_owed_the_messages_recovered_carry_it() -> None:
    hub = Hub(epoch=5, numbered_elsewhere=True)
    for n in (1, 2):
        hub.apply(Message(SUBJECT, b"r", retained=True, epoch=5, seq=n), 0.0)
    assert described(resume(hub, Position(5, 0))) == [
        ALLOW,
        ("recovered", 1),
        ("recovered", 2),
        ops.SubjectStatus(ops.Status.DATA_SYNC, SUBJECT, Position(5, 2)),
    ]


def test_a_resume_waiting_for_a_lagging_member_gets_its_snapshot_when_it_catches_up() -> None:
    hub = Hub(epoch=1, numbered_elsewhere=True)
    hub.apply(Message(SUBJECT, b"1", retained=True, epoch=5, seq=1), 0.0)
    sink = OpSink()
    request = ops.SubscriptionRequest(SUBJECT, Position(5, 2), snapshot=True)
    assert hub.subscribe(sink, request, 0.0) == [ALLOW]
    hub.apply(Message(SUBJECT, b"2", epoch=5, seq=2), 0.0)
    assert described(sink.received()) == [
        ("snapshot", 1),
        ops.SubjectStatus(ops.Status.DATA_SYNC, SUBJECT, Position(5, 2)),
    ]


def test_the_answer_bound_counts_the_snapshot_and_the_messages_recovered() -> None:
    hub = Hub(epoch=9)
    publish(hub, "s" * 1000, retained=True)
    publish(hub, "m" * 1000)
    plain = hub.answer_bytes(ops.SubscriptionRequest(SUBJECT, Position(9, 0)))
    asked = hub.answer_bytes(ops.SubscriptionRequest(SUBJECT, Position(9, 0), snapshot=True))
    assert plain >= 2000 and asked >= plain + 1000


def test_the_key_goes_over_the_wire_only_when_set() -> None:
    asked = ops.Subscribe((ops.SubscriptionRequest(SUBJECT, Position(9, 2), snapshot=True),))
    plain = ops.Subscribe((ops.SubscriptionRequest(SUBJECT, Position(9, 2)),))
    assert ops.decode_client_op(ops.encode_client_op(asked)) == asked
    assert ops.decode_client_op(ops.encode_client_op(plain)) == plain
    assert b"snapshot" not in ops.encode_client_op(plain)
    assert MessageType.SNAPSHOT.value == "snapshot"


def test_a_key_that_is_not_a_boolean_is_a_bad_operation() -> None:
    body = {"op": "subscribe", "subjects": [{"subject": SUBJECT, "epoch": 9, "seq": 2,
                                              "snapshot": "yes"}]}
    with pytest.raises(ops.OperationError):
        ops.decode_client_op(cbor2.dumps(body))


def test_a_resume_with_history_gets_the_history_as_of_its_position_first() -> None:
    # a first subscribe with history cut before its batch: the last N up to the
    # position, then what was missed (was: history ignored on a resume)
    hub = Hub(epoch=9)
    for i in range(6):
        publish(hub, str(i))
    request = ops.SubscriptionRequest(SUBJECT, Position(9, 4), history=3)
    assert described(hub.subscribe(OpSink(), request, 0.0)) == [
        ALLOW,
        ("historical", 2),
        ("historical", 3),
        ("historical", 4),
        ("recovered", 5),
        ("recovered", 6),
        ops.SubjectStatus(ops.Status.DATA_SYNC, SUBJECT, Position(9, 6)),
    ]
    fewer = ops.SubscriptionRequest(SUBJECT, Position(9, 6), history=10)  # all it has
    assert [m for m in described(hub.subscribe(OpSink(), fewer, 0.0))
            if isinstance(m, tuple)] == [("historical", s) for s in range(1, 7)]
    bound = hub.answer_bytes(request)
    assert bound > hub.answer_bytes(ops.SubscriptionRequest(SUBJECT, Position(9, 4)))
