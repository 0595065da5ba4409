"""Hub semantics without sockets: numbering, fan-out, snapshot, recovery, history."""

from __future__ import annotations

import cbor2
import pytest

from migratory.config import Config
from migratory.model.conflation import Conflator
from migratory.model.message import Message, MessageType
from migratory.model.position import Position
from migratory.protocol import ops
from migratory.protocol.websocket import FrameDecoder
from migratory.server.app import build_hub
from migratory.server.hub import Hub

SUBJECT = "/Stocks/NYSE/IBM"


class RecordingSink:
    def __init__(self) -> None:
        self.frames: list[bytes] = []

    def deliver(self, frame: bytes) -> None:
        self.frames.append(frame)

    def messages(self) -> list[Message]:
        decoder = FrameDecoder(client_frames=False)
        out = []
        for event in decoder.events(b"".join(self.frames)):
            op = ops.decode_server_op(event.data)  # type: ignore[union-attr]
            assert isinstance(op, ops.Deliver)
            out.extend(op.messages)
        return out


def publish(hub: Hub, content: str, now: float = 0.0, **kw: object) -> Message:
    return hub.publish(Message(SUBJECT, content.encode(), **kw), now)  # type: ignore[arg-type]


def subscribe(hub: Hub, sink: RecordingSink, **kw: object) -> list[ops.ServerOp]:
    return hub.subscribe(sink, ops.SubscriptionRequest(SUBJECT, **kw), 0.0)  # type: ignore[arg-type]


def test_positions_increase_by_one_within_the_epoch() -> None:
    hub = Hub(epoch=7)
    seqs = [publish(hub, str(i)).position for i in range(5)]
    assert seqs == [Position(7, s) for s in range(1, 6)]


def test_one_frame_object_is_shared_by_every_subscriber() -> None:
    hub = Hub(epoch=1)
    sinks = [RecordingSink() for _ in range(3)]
    for sink in sinks:
        subscribe(hub, sink)
    publish(hub, "x")
    assert sinks[0].frames[0] is sinks[1].frames[0] is sinks[2].frames[0]
    payload = cbor2.loads(FrameDecoder(client_frames=False).events(sinks[0].frames[0])[0].data)  # type: ignore[union-attr]
    assert payload["type"] == "update" and payload["seq"] == 1


def test_fresh_subscribe_gets_allow_with_position_then_snapshot() -> None:
    hub = Hub(epoch=3)
    publish(hub, "193", retained=True, fields={"volume": "6.62M"})
    publish(hub, "192", retained=True)
    first = subscribe(hub, RecordingSink())
    assert first[0] == ops.SubjectStatus(ops.Status.SUBSCRIBE_ALLOW, SUBJECT, Position(3, 2))
    assert isinstance(first[1], ops.Deliver)
    (snapshot,) = first[1].messages
    assert (snapshot.content, dict(snapshot.fields), snapshot.type) == (
        b"192",
        {"volume": "6.62M"},
        MessageType.SNAPSHOT,
    )


def test_publish_snapshot_message_false_sends_no_snapshot() -> None:
    hub = Hub(epoch=3, publish_snapshot=False)
    publish(hub, "193", retained=True)
    assert subscribe(hub, RecordingSink()) == [
        ops.SubjectStatus(ops.Status.SUBSCRIBE_ALLOW, SUBJECT, Position(3, 1))
    ]


def test_history_sends_last_n_as_historical_instead_of_snapshot() -> None:
    hub = Hub(epoch=1)
    for i in range(5):
        publish(hub, str(i), retained=True)
    _, batch = subscribe(hub, RecordingSink(), history=2)
    assert isinstance(batch, ops.Deliver)
    assert [(m.content, m.type) for m in batch.messages] == [
        (b"3", MessageType.HISTORICAL),
        (b"4", MessageType.HISTORICAL),
    ]


def test_resume_within_cache_recovers_exactly_the_missed_then_data_sync() -> None:
    hub = Hub(epoch=9)
    for i in range(6):
        publish(hub, str(i))
    out = subscribe(hub, RecordingSink(), position=Position(9, 3))
    assert out[0] == ops.SubjectStatus(ops.Status.SUBSCRIBE_ALLOW, SUBJECT)
    assert isinstance(out[1], ops.Deliver)
    assert [(m.seq, m.type) for m in out[1].messages] == [
        (4, MessageType.RECOVERED),
        (5, MessageType.RECOVERED),
        (6, MessageType.RECOVERED),
    ]
    assert out[2] == ops.SubjectStatus(ops.Status.DATA_SYNC, SUBJECT, Position(9, 6))


def test_resume_up_to_date_is_data_sync_without_messages() -> None:
    hub = Hub(epoch=9)
    publish(hub, "a")
    out = subscribe(hub, RecordingSink(), position=Position(9, 1))
    assert out[1:] == [ops.SubjectStatus(ops.Status.DATA_SYNC, SUBJECT, Position(9, 1))]


@pytest.mark.parametrize(
    "position",
    [Position(8, 3), Position(9, 1), Position(9, 99)],
    ids=["unknown-epoch", "cache-no-longer-reaches-back", "seq-ahead"],
)
def test_resume_that_cannot_be_served_gets_snapshot_and_data_resync(position: Position) -> None:
    hub = Hub(epoch=9, max_cached_messages=3)
    for i in range(6):
        publish(hub, str(i), retained=True)
    out = subscribe(hub, RecordingSink(), position=position)
    assert isinstance(out[1], ops.Deliver)
    assert out[1].messages[0].type is MessageType.SNAPSHOT
    assert out[1].messages[0].content == b"5"
    assert out[2] == ops.SubjectStatus(ops.Status.DATA_RESYNC, SUBJECT, Position(9, 6))


def test_expired_cache_means_resync() -> None:
    hub = Hub(epoch=1, cache_expire_seconds=10)
    subscribe(hub, RecordingSink())  # (a subject nobody holds is forgotten: test_hub_forget)
    publish(hub, "a", now=0.0)
    publish(hub, "b", now=0.0)
    hub.expire(now=11.0)
    out = subscribe(hub, RecordingSink(), position=Position(1, 1))
    assert out[-1] == ops.SubjectStatus(ops.Status.DATA_RESYNC, SUBJECT, Position(1, 2))


def test_unsubscribed_sink_gets_nothing_more() -> None:
    hub = Hub(epoch=1)
    sink = RecordingSink()
    subscribe(hub, sink)
    publish(hub, "a")
    hub.unsubscribe(sink, SUBJECT)
    publish(hub, "b")
    assert [m.content for m in sink.messages()] == [b"a"]


def test_conflated_subscription_gets_one_merged_message_per_period() -> None:
    hub = Hub(epoch=1)
    sink = RecordingSink()
    hub.subscribe(sink, ops.SubscriptionRequest(SUBJECT, conflation_ms=547), now=0.0)
    hub.publish(Message(SUBJECT, b"195", {"ask": "192"}), 0.1)
    hub.publish(Message(SUBJECT, b"196", {"bid": "197"}), 0.3)
    hub.tick(0.45)
    assert sink.frames == []  # 547 ms rounds down to 500 ms
    hub.tick(0.5)
    (merged,) = sink.messages()
    assert (merged.content, dict(merged.fields), merged.seq) == (
        b"196",
        {"ask": "192", "bid": "197"},
        2,
    )
    hub.tick(1.0)
    assert len(sink.frames) == 1


def test_a_conflated_message_is_no_larger_than_max_message_size() -> None:
    """A publisher sending a new field name in each message (10,000 in one period of an
    hour) made every conflated subscription hold all of them, and then receive one
    message of all their fields, far past MaxMessageSize."""
    hub = build_hub(Config.from_mapping({"MaxMessageSize": "1000"}), epoch=1)
    sink = RecordingSink()
    hub.subscribe(sink, ops.SubscriptionRequest(SUBJECT, conflation_ms=3_600_000), now=0.0)
    for i in range(10_000):
        hub.publish(Message(SUBJECT, b"x", {f"field{i}": "v"}), 0.1)
    hub.tick(3600.0)
    (merged,) = sink.messages()
    assert merged.size() <= 1000
    assert len(merged.fields) < 100 and merged.fields["field9999"] == "v"


def test_a_tick_polls_only_the_conflated_subscriptions_with_a_message_waiting(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """10,000 idle conflated subscriptions cost a tick nothing (every one was polled at
    every tick, 100 ms: 72 ms per tick at 100,000); one with a message waiting is polled
    until its period ends, and still emits once per period, at the period's end, after
    a long idle stretch."""
    polls = [0]
    original = Conflator.poll

    def counted(self: Conflator, now: float) -> Message | None:
        polls[0] += 1
        return original(self, now)

    monkeypatch.setattr(Conflator, "poll", counted)
    hub = Hub(epoch=1)
    sink = RecordingSink()
    for i in range(10_000):
        hub.subscribe(sink, ops.SubscriptionRequest(f"/idle/s{i}", conflation_ms=500), 0.0)
    hub.subscribe(sink, ops.SubscriptionRequest(SUBJECT, conflation_ms=500), now=0.0)
    for tick in range(1, 101):
        hub.tick(tick / 10)
    assert polls[0] == 0
    hub.publish(Message(SUBJECT, b"1"), 10.05)  # idle since 0.0: the period ends at 10.5
    for tick in range(101, 105):
        hub.tick(tick / 10)
    assert sink.frames == [] and polls[0] == 4  # 10.1 .. 10.4
    hub.tick(10.5)
    assert [m.content for m in sink.messages()] == [b"1"] and polls[0] == 5
    hub.publish(Message(SUBJECT, b"2"), 10.55)
    hub.tick(10.6)
    assert len(sink.frames) == 1  # not before 11.0: one per period
    hub.tick(11.0)
    assert [m.content for m in sink.messages()] == [b"1", b"2"]
    hub.tick(11.1)
    assert polls[0] == 7


def test_positions_survive_unsubscribe_of_everyone() -> None:
    hub = Hub(epoch=1)
    sink = RecordingSink()
    subscribe(hub, sink)
    publish(hub, "a")
    hub.unsubscribe(sink, SUBJECT)
    assert publish(hub, "b").seq == 2


class DroppingSink(RecordingSink):
    """Unsubscribes itself while being delivered to, as a slow consumer does."""

    def __init__(self, hub: Hub) -> None:
        super().__init__()
        self.hub = hub

    def deliver(self, frame: bytes) -> None:
        super().deliver(frame)
        self.hub.unsubscribe(self, SUBJECT)


def test_a_sink_dropping_out_during_fan_out_does_not_disturb_the_others() -> None:
    hub = Hub(epoch=1)
    first, dropping, last = RecordingSink(), DroppingSink(hub), RecordingSink()
    for sink in (first, dropping, last):
        subscribe(hub, sink)
    publish(hub, "a")
    publish(hub, "b")
    assert [m.content for m in last.messages()] == [b"a", b"b"]
    assert [m.content for m in dropping.messages()] == [b"a"]


def test_apply_takes_positions_from_the_coordination() -> None:
    hub = Hub(epoch=1)
    sink = RecordingSink()
    subscribe(hub, sink)
    assert hub.apply(Message(SUBJECT, b"a", epoch=5, seq=1), 0.0)
    assert hub.apply(Message(SUBJECT, b"b", epoch=5, seq=2), 0.0)
    assert not hub.apply(Message(SUBJECT, b"b", epoch=5, seq=2), 0.0)  # already applied
    with pytest.raises(ValueError, match="gap"):
        hub.apply(Message(SUBJECT, b"d", epoch=5, seq=4), 0.0)
    assert [(m.epoch, m.seq) for m in sink.messages()] == [(5, 1), (5, 2)]
    assert hub.position(SUBJECT) == Position(5, 2)
    out = hub.subscribe(RecordingSink(), ops.SubscriptionRequest(SUBJECT, Position(5, 1)), 0.0)
    assert out[-1] == ops.SubjectStatus(ops.Status.DATA_SYNC, SUBJECT, Position(5, 2))


class OpSink(RecordingSink):
    """Decodes every frame it got, statuses included."""

    def received(self) -> list[ops.ServerOp]:
        decoder = FrameDecoder(client_frames=False)
        return [
            ops.decode_server_op(event.data)  # type: ignore[union-attr]
            for event in decoder.events(b"".join(self.frames))
        ]

    def messages_after_statuses(self) -> list[Message]:
        return [m for op in self.received() if isinstance(op, ops.Deliver) for m in op.messages]


def cluster_hub_at(seq: int) -> Hub:
    """A cluster member's hub that has applied ``seq`` messages of epoch 5."""
    hub = Hub(epoch=1, numbered_elsewhere=True)
    for n in range(1, seq + 1):
        hub.apply(Message(SUBJECT, str(n).encode(), epoch=5, seq=n), 0.0)
    return hub


def test_resume_ahead_of_a_lagging_member_waits_then_continues_without_going_back() -> None:
    hub = cluster_hub_at(3)
    sink = OpSink()
    out = subscribe(hub, sink, position=Position(5, 6))
    assert out == [ops.SubjectStatus(ops.Status.SUBSCRIBE_ALLOW, SUBJECT)]
    for n in range(4, 7):  # the member catches up to the client's position
        hub.apply(Message(SUBJECT, str(n).encode(), epoch=5, seq=n), 0.0)
    assert sink.received() == [ops.SubjectStatus(ops.Status.DATA_SYNC, SUBJECT, Position(5, 6))]
    hub.apply(Message(SUBJECT, b"7", epoch=5, seq=7), 0.0)
    assert [m.seq for m in sink.messages_after_statuses()] == [7]
    assert hub.statistics().subscriptions == 1


def reposition_like(hub: Hub, peer: Hub) -> None:
    """Move ``hub``'s subject to where ``peer`` has it (what a cluster cache sync does)."""
    ((subject, position, snapshot, run),) = list(peer.numbered())
    hub.reposition(subject, position, snapshot, run.messages(), 0.0)


def test_waiting_resume_caught_up_by_a_reposition_recovers_what_it_missed() -> None:
    hub = cluster_hub_at(2)
    sink = OpSink()
    subscribe(hub, sink, position=Position(5, 4))
    reposition_like(hub, cluster_hub_at(6))
    recovered, synced = sink.received()
    assert isinstance(recovered, ops.Deliver)
    assert [(m.seq, m.type) for m in recovered.messages] == [
        (5, MessageType.RECOVERED),
        (6, MessageType.RECOVERED),
    ]
    assert synced == ops.SubjectStatus(ops.Status.DATA_SYNC, SUBJECT, Position(5, 6))


def test_waiting_resume_can_be_unsubscribed() -> None:
    hub = cluster_hub_at(1)
    sink = OpSink()
    subscribe(hub, sink, position=Position(5, 3))
    hub.unsubscribe(sink, SUBJECT)
    for n in range(2, 5):
        hub.apply(Message(SUBJECT, b"x", epoch=5, seq=n), 0.0)
    assert sink.frames == []
    assert hub.statistics().subscriptions == 0


def test_a_single_server_ahead_resume_is_a_resync_not_a_wait() -> None:
    """Outside a cluster a later position of this epoch can only be a client's error."""
    hub = Hub(epoch=9)
    publish(hub, "a", retained=True)
    out = subscribe(hub, RecordingSink(), position=Position(9, 5))
    assert out[-1] == ops.SubjectStatus(ops.Status.DATA_RESYNC, SUBJECT, Position(9, 1))


def test_a_jump_ahead_gives_live_subscribers_what_it_jumped_over() -> None:
    hub = cluster_hub_at(2)
    sink = OpSink()
    subscribe(hub, sink)
    sink.frames.clear()
    reposition_like(hub, cluster_hub_at(5))
    hub.apply(Message(SUBJECT, b"6", epoch=5, seq=6), 0.0)
    assert [m.seq for m in sink.messages_after_statuses()] == [3, 4, 5, 6]


def test_a_jump_of_a_subject_not_numbered_here_yet_gives_live_subscribers_all_of_it() -> None:
    """Found by the cluster model: a subscriber of a subject this member had not numbered
    yet saw nothing of it; a sync whose cache starts at seq 1 is all it missed."""
    hub = Hub(epoch=1, numbered_elsewhere=True)
    sink = OpSink()
    subscribe(hub, sink)
    sink.frames.clear()
    reposition_like(hub, cluster_hub_at(3))
    assert [(m.seq, m.type) for m in sink.messages_after_statuses()] == [
        (1, MessageType.UPDATE), (2, MessageType.UPDATE), (3, MessageType.UPDATE)
    ]
    assert not any(isinstance(op, ops.SubjectStatus) for op in sink.received())


def test_a_jump_past_the_cache_tells_live_subscribers_data_resync() -> None:
    hub = Hub(epoch=1, numbered_elsewhere=True, max_cached_messages=2)
    hub.apply(Message(SUBJECT, b"1", epoch=5, seq=1, retained=True), 0.0)
    sink = OpSink()
    subscribe(hub, sink)
    sink.frames.clear()
    peer = Hub(epoch=1, numbered_elsewhere=True, max_cached_messages=2)
    for n in range(1, 7):
        peer.apply(Message(SUBJECT, str(n).encode(), epoch=5, seq=n, retained=True), 0.0)
    reposition_like(hub, peer)
    snapshot, resync = sink.received()
    assert isinstance(snapshot, ops.Deliver) and snapshot.messages[0].content == b"6"
    assert resync == ops.SubjectStatus(ops.Status.DATA_RESYNC, SUBJECT, Position(5, 6))


def test_reposition_to_seq_0_forgets_the_subject_numbering() -> None:
    hub = cluster_hub_at(3)
    hub.reposition(SUBJECT, Position(1, 0), None, (), 0.0)
    assert hub.position(SUBJECT) is None and list(hub.numbered()) == []


def test_reposition_with_cached_messages_that_do_not_fit_changes_nothing() -> None:
    hub = cluster_hub_at(3)
    ((subject, _, snapshot, run),) = list(hub.numbered())
    cached = run.messages()
    with pytest.raises(ValueError):
        hub.reposition(subject, Position(5, 9), snapshot, cached, 0.0)
    with pytest.raises(ValueError):
        hub.reposition(subject, Position(6, 3), snapshot, cached, 0.0)
    assert hub.position(SUBJECT) == Position(5, 3)
