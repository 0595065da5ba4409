"""One-off subjects are forgotten once nothing is left to serve, and a subject created
again never reuses a position (issue 14: 200,000 one-off subjects were never forgotten)."""

from __future__ import annotations

from migratory.model.message import Message, MessageType
from migratory.model.position import Position
from migratory.protocol import ops
from migratory.server.hub import Hub


class Sink:
    def __init__(self) -> None:
        self.frames: list[bytes] = []

    def deliver(self, frame: bytes) -> None:
        self.frames.append(frame)


def test_spent_subjects_are_forgotten_after_their_cache_expires() -> None:
    hub = Hub(epoch=7, cache_expire_seconds=10)
    for i in range(1000):
        hub.publish(Message(f"/one/off{i}", b"x"), now=0.0)
    hub.publish(Message("/kept/retained", b"r", retained=True), now=0.0)
    sink = Sink()
    hub.subscribe(sink, ops.SubscriptionRequest("/kept/watched"), now=0.0)
    hub.publish(Message("/kept/watched", b"w"), now=0.0)
    assert hub.statistics().subjects == 1002
    hub.expire(5.0)
    assert hub.statistics().subjects == 1002  # still cached
    hub.expire(11.0)
    assert hub.statistics().subjects == 2  # the snapshot and the subscribed one stay
    assert hub.snapshot("/kept/retained") is not None
    assert hub.position("/kept/watched") == Position(7, 1)


def test_a_forgotten_subject_comes_back_in_a_new_epoch() -> None:
    hub = Hub(epoch=7, cache_expire_seconds=10)
    first = hub.publish(Message("/one/off", b"old"), now=0.0)
    assert first.position == Position(7, 1)
    hub.expire(11.0)
    assert hub.position("/one/off") is None
    second = hub.publish(Message("/one/off", b"new"), now=12.0)
    assert second.seq == 1 and second.epoch != 7  # (7, 1) meant "old"; never reused
    # a client resuming from the old position is told it cannot be served (no silent gap)
    sink = Sink()
    answer = hub.subscribe(sink, ops.SubscriptionRequest("/one/off", Position(7, 1)), now=12.0)
    statuses = [op.status for op in answer if isinstance(op, ops.SubjectStatus)]
    assert statuses == [ops.Status.SUBSCRIBE_ALLOW, ops.Status.DATA_RESYNC]


def test_a_client_that_saw_nothing_still_gets_everything_after_a_new_epoch() -> None:
    hub = Hub(epoch=7, cache_expire_seconds=10)
    hub.publish(Message("/one/off", b"old"), now=0.0)
    hub.expire(11.0)
    hub.publish(Message("/other/subject", b"1"), now=12.0)
    sink = Sink()
    answer = hub.subscribe(sink, ops.SubscriptionRequest("/other/subject", Position(7, 0)), 12.0)
    delivered = [m for op in answer if isinstance(op, ops.Deliver) for m in op.messages]
    assert [m.content for m in delivered] == [b"1"]
    assert delivered[0].type is MessageType.RECOVERED


def test_a_member_numbered_elsewhere_forgets_nothing() -> None:
    hub = Hub(epoch=7, cache_expire_seconds=10, numbered_elsewhere=True)
    hub.apply(Message("/one/off", b"x", epoch=9, seq=1), now=0.0)
    hub.expire(11.0)
    assert hub.position("/one/off") == Position(9, 1)


def test_a_budgeted_expiry_sweeps_a_slice_per_call_and_goes_round() -> None:
    hub = Hub(epoch=7, cache_expire_seconds=10)
    for i in range(1000):
        hub.publish(Message(f"/one/off{i}", b"x"), now=0.0)
    remaining = []
    for _ in range(4):
        hub.expire(11.0, budget=300)
        remaining.append(hub.statistics().subjects)
    assert remaining == [700, 400, 100, 0]
    for i in range(10):
        hub.publish(Message(f"/two/s{i}", b"x"), now=20.0)
    hub.expire(31.0, budget=300)  # a new sweep: the subjects as they are now
    assert hub.statistics().subjects == 0 and hub.forgotten == 1010
