"""A resume in slices (migratory/server/hub_resume.py): publishes between two slices
neither overtake a recovered message nor go missing, none comes twice, DATA_SYNC comes
after the last recovered one -- and each slice holds at most ``limit`` messages, but
the last (what was published while the slices went on)."""

from __future__ import annotations

from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from migratory.model.message import Message, MessageType
from migratory.model.position import Position
from migratory.protocol import ops
from migratory.protocol.websocket import FrameDecoder
from migratory.server.hub import Hub, ResumeCursor

SUBJECT = "/Stocks/NYSE/IBM"


class Stream:
    """What one client receives, in order: the answers of the hub's calls (sent as they
    come back, as the session does) and the live messages the hub delivers to it."""

    def __init__(self) -> None:
        self.items: list[Any] = []

    def deliver(self, frame: bytes) -> None:  # the hub's fan-out: live messages
        for event in FrameDecoder(client_frames=False).events(frame):
            op = ops.decode_server_op(event.data)  # type: ignore[union-attr]
            assert isinstance(op, ops.Deliver)
            self.items.extend(op.messages)

    def answer(self, answer: list[ops.ServerOp]) -> None:
        for op in answer:
            if isinstance(op, ops.Deliver):
                self.items.extend(op.messages)
            else:
                self.items.append(op)


def publish(hub: Hub, count: int) -> None:
    for _ in range(count):
        hub.publish(Message(SUBJECT, b"x"), 0.0)


def check(stream: Stream, since: int, last: int) -> None:
    """Recovered messages ``since`` + 1 .. on, in order, none twice, then DATA_SYNC at
    the last of them, then live updates up to ``last``, none missing (or, the cache
    overrun, DATA_RESYNC where the recovered ones stop, then live ones from there)."""
    statuses = [i for i, item in enumerate(stream.items) if isinstance(item, ops.SubjectStatus)]
    assert stream.items[statuses[0]].status is ops.Status.SUBSCRIBE_ALLOW
    assert len(statuses) == 2, stream.items
    end = stream.items[statuses[1]]
    before = stream.items[statuses[0] + 1:statuses[1]]
    after = stream.items[statuses[1] + 1:]
    assert [m.seq for m in before] == list(range(since + 1, since + 1 + len(before)))
    assert all(m.type is MessageType.RECOVERED for m in before)
    assert all(m.type is MessageType.UPDATE for m in after)
    if end.status is ops.Status.DATA_SYNC:
        assert end.position.seq == since + len(before)
    else:
        assert end.status is ops.Status.DATA_RESYNC
    assert [m.seq for m in after] == list(range(end.position.seq + 1, last + 1))


@settings(max_examples=150, deadline=None)
@given(
    cached=st.integers(1, 300),
    back=st.integers(0, 250),
    limit=st.integers(1, 40),
    between=st.lists(st.integers(0, 60), max_size=30),
    after=st.integers(0, 5),
)
def test_publishes_between_slices_come_in_order_once_after_the_recovered_ones(
    cached: int, back: int, limit: int, between: list[int], after: int
) -> None:
    hub = Hub(epoch=1, max_cached_messages=200)
    publish(hub, cached)
    since = max(0, cached - back)
    stream = Stream()
    request = ops.SubscriptionRequest(SUBJECT, position=Position(hub.epoch, since))
    answer, cursor = hub.start_resume(stream, request, 0.0, limit)
    stream.answer(answer)
    slices = 0
    while cursor is not None:
        publish(hub, between[slices] if slices < len(between) else 0)
        answer, cursor = hub.continue_resume(stream, cursor, 0.0, limit)
        stream.answer(answer)
        slices += 1
        assert slices < 1000
    publish(hub, after)
    check(stream, since, hub.position(SUBJECT).seq)  # type: ignore[union-attr]


def test_each_slice_holds_at_most_the_limit_until_the_last() -> None:
    """1,000 messages missed, slices of 100: ten of them (a resume was one answer of
    1,000 messages, ~4 ms of the loop; a herd of them, seconds). The last takes what was
    published meanwhile too, however many: the resume cannot be outrun."""
    hub = Hub(epoch=1)
    publish(hub, 1000)
    stream = Stream()
    request = ops.SubscriptionRequest(SUBJECT, position=Position(hub.epoch, 0))
    answer, cursor = hub.start_resume(stream, request, 0.0, 100)
    sizes = [sum(len(op.messages) for op in answer if isinstance(op, ops.Deliver))]
    while cursor is not None:
        assert isinstance(cursor, ResumeCursor)
        if cursor.reached.seq == 800:
            publish(hub, 150)  # faster than the slices: the last one takes them all
        answer, cursor = hub.continue_resume(stream, cursor, 0.0, 100)
        sizes.append(sum(len(op.messages) for op in answer if isinstance(op, ops.Deliver)))
        stream.answer(answer)
    assert sizes == [100] * 9 + [250]
    assert isinstance(answer[-1], ops.SubjectStatus)
    assert answer[-1].status is ops.Status.DATA_SYNC and answer[-1].position.seq == 1150  # type: ignore[union-attr]


def test_a_checkpoint_the_cache_dropped_ends_in_resync_not_a_gap() -> None:
    hub = Hub(epoch=1, max_cached_messages=100)
    publish(hub, 100)
    stream = Stream()
    request = ops.SubscriptionRequest(SUBJECT, position=Position(hub.epoch, 10))
    answer, cursor = hub.start_resume(stream, request, 0.0, 20)
    stream.answer(answer)
    publish(hub, 100)  # the cache moved past the checkpoint (seq 30)
    assert cursor is not None
    answer, cursor = hub.continue_resume(stream, cursor, 0.0, 20)
    stream.answer(answer)
    assert cursor is None
    assert isinstance(answer[-1], ops.SubjectStatus)
    assert answer[-1].status is ops.Status.DATA_RESYNC
    publish(hub, 3)
    check(stream, 10, 203)


def test_a_herd_from_one_position_still_shares_each_slice() -> None:
    hub = Hub(epoch=1)
    publish(hub, 1000)
    for _ in range(50):
        cursor: ResumeCursor | None
        request = ops.SubscriptionRequest(SUBJECT, position=Position(hub.epoch, 500))
        _, cursor = hub.start_resume(Stream(), request, 0.0, 128)
        while cursor is not None:
            _, cursor = hub.continue_resume(Stream(), cursor, 0.0, 128)
    assert (hub.recovery.built, hub.recovery.shared) == (4, 49 * 4)
