"""Resumes of one subject from one position share their recovered batch: built from the
cache, copied as RECOVERED and encoded once (migratory/server/shared_recovery.py)."""

from __future__ import annotations

import pytest
from test_hub import RecordingSink

from migratory.model.message import Message
from migratory.model.position import Position
from migratory.protocol import ops
from migratory.protocol import websocket as ws
from migratory.server.hub import Hub

SUBJECT = "/Stocks/NYSE/IBM"


def op_frame(op: ops.ServerOp) -> bytes:
    return ws.encode_binary(ops.encode_server_op(op))


def resume(hub: Hub, position: Position, now: float = 1.0) -> list[ops.ServerOp]:
    answer = hub.subscribe(RecordingSink(), ops.SubscriptionRequest(SUBJECT, position=position),
                           now)
    assert isinstance(answer[0], ops.SubjectStatus)  # SUBSCRIBE_ALLOW
    return answer[1:]


def published(count: int, **hub_settings: object) -> tuple[Hub, int]:
    hub = Hub(epoch=1, **hub_settings)  # type: ignore[arg-type]
    for n in range(count):
        hub.publish(Message(SUBJECT, b"m%d" % n), 0.0)
    return hub, hub.epoch


def test_a_herd_resuming_from_one_position_builds_the_batch_once(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """100 clients resuming 100 messages back: each rebuilt the 100 messages from the
    cache and made a recovered copy of each (10,000 copies; with the encoding, 1.9 ms per
    client on the event loop at 10 subjects: 1,000 clients were a 1.9 s stop). Now 100,
    one batch, one frame."""
    hub, epoch = published(1000)
    copies = [0]
    as_type = Message.as_type

    def counted(self: Message, kind: object) -> Message:
        copies[0] += 1
        return as_type(self, kind)  # type: ignore[arg-type]

    monkeypatch.setattr(Message, "as_type", counted)
    answers = [resume(hub, Position(epoch, 900)) for _ in range(100)]
    assert copies[0] == 100
    delivers = {id(answer[0]) for answer in answers}
    assert len(delivers) == 1
    deliver = answers[0][0]
    assert isinstance(deliver, ops.Deliver) and [m.seq for m in deliver.messages] == list(
        range(901, 1001))
    assert all(answer[1] == ops.SubjectStatus(ops.Status.DATA_SYNC, SUBJECT,
                                              Position(epoch, 1000)) for answer in answers)
    frames = {id(hub.recovery.frame(answer[0], op_frame)) for answer in answers}
    assert len(frames) == 1 and hub.recovery.frame(deliver, op_frame) == op_frame(deliver)


def test_a_batch_is_not_served_once_the_subject_or_its_cache_moved_on() -> None:
    hub, epoch = published(10, max_cached_messages=10)
    first = resume(hub, Position(epoch, 5))
    hub.publish(Message(SUBJECT, b"new"), 0.0)  # the last seq moved, the oldest was dropped
    again = resume(hub, Position(epoch, 5))
    assert again[0] is not first[0]
    assert [m.seq for m in again[0].messages] == [6, 7, 8, 9, 10, 11]  # type: ignore[union-attr]
    for _ in range(6):
        hub.publish(Message(SUBJECT, b"more"), 0.0)  # seq 6 no longer cached
    assert [type(op) for op in resume(hub, Position(epoch, 4))] == [ops.SubjectStatus]
    assert resume(hub, Position(epoch, 4))[-1].status is ops.Status.DATA_RESYNC  # type: ignore[union-attr]


def test_the_batches_kept_hold_at_most_max_messages_and_max_bytes() -> None:
    from migratory.server import shared_recovery

    hub, epoch = published(1000)
    for since in range(0, 1000, 10):
        for answer in (resume(hub, Position(epoch, since)), resume(hub, Position(epoch, since))):
            hub.recovery.frame(answer[0], op_frame)
    messages, held = hub.recovery.held
    assert messages <= shared_recovery.MAX_MESSAGES and held <= shared_recovery.MAX_BYTES
    assert (hub.recovery.built, hub.recovery.shared) == (100, 100)


def test_large_messages_are_kept_within_max_bytes(monkeypatch: pytest.MonkeyPatch) -> None:
    from migratory.server import shared_recovery

    monkeypatch.setattr(shared_recovery, "MAX_BYTES", 300_000)
    hub = Hub(epoch=1)
    for n in range(30):
        hub.publish(Message(SUBJECT, bytes([n]) * 10_000), 0.0)
    for since in range(0, 30):
        answer = resume(hub, Position(hub.epoch, since))
        if answer[0] is not answer[-1]:
            hub.recovery.frame(answer[0], op_frame)
        assert hub.recovery.held[1] <= 300_000
