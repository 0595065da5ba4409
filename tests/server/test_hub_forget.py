"""One-off subjects are forgotten once nothing is left to serve, and a subject created
again never reuses a position (issue 14: 200,000 one-off subjects were never forgotten)."""

from __future__ import annotations

from migratory.model.message import Message, MessageType
from migratory.model.position import Position
from migratory.protocol import ops
from migratory.protocol.websocket import BinaryMessage, FrameDecoder
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


def statuses(answer: list[ops.ServerOp]) -> list[tuple[ops.Status, Position | None]]:
    return [(op.status, op.position) for op in answer if isinstance(op, ops.SubjectStatus)]


class OpSink(Sink):
    def received(self) -> list[ops.ServerOp]:
        decoder = FrameDecoder(client_frames=False)
        return [ops.decode_server_op(e.data) for e in decoder.events(b"".join(self.frames))
                if isinstance(e, BinaryMessage)]


def test_a_member_numbered_elsewhere_forgets_a_spent_subject_until_its_next_message() -> None:
    """A Guaranteed member forgot nothing: ~610 bytes per subject ever published, for
    ever (1,000,000 one-off subjects in a day: +779 MiB, benchmarks/cache_memory.py)."""
    hub = Hub(epoch=1, cache_expire_seconds=10, numbered_elsewhere=True)
    for seq in (1, 2, 3):
        hub.apply(Message("/one/off", b"x", epoch=9, seq=seq), now=0.0)
    hub.expire(11.0)
    assert hub.position("/one/off") is None and hub.statistics().subjects_forgotten == 1
    # a client resuming meanwhile is told DATA_RESYNC (its position kept) and waits
    sink = OpSink()
    answer = hub.subscribe(sink, ops.SubscriptionRequest("/one/off", Position(9, 3)), 12.0)
    assert statuses(answer) == [(ops.Status.SUBSCRIBE_ALLOW, None), (ops.Status.DATA_RESYNC, None)]
    # the next message brings the position back, and the resume goes on from it
    assert hub.apply(Message("/one/off", b"4", epoch=9, seq=4), now=13.0)
    assert hub.position("/one/off") == Position(9, 4)
    recovered, synced = sink.received()
    assert isinstance(recovered, ops.Deliver)
    assert [(m.seq, m.type) for m in recovered.messages] == [(4, MessageType.RECOVERED)]
    assert synced == ops.SubjectStatus(ops.Status.DATA_SYNC, "/one/off", Position(9, 4))


def test_a_lagging_member_does_not_repeat_what_a_resumed_client_has() -> None:
    """The member has not numbered the subject yet (it lags, or forgot it); the client
    resumes from seq 3: seqs 1-3 reach the member later and are not sent again (before,
    the client was subscribed at once and got them a second time)."""
    hub = Hub(epoch=1, numbered_elsewhere=True)
    sink = OpSink()
    hub.subscribe(sink, ops.SubscriptionRequest("/a/b", Position(9, 3)), 0.0)
    sink.frames.clear()
    for seq in (1, 2, 3, 4):
        hub.apply(Message("/a/b", str(seq).encode(), epoch=9, seq=seq), 0.0)
    received = sink.received()
    assert received[0] == ops.SubjectStatus(ops.Status.DATA_SYNC, "/a/b", Position(9, 3))
    assert [m.seq for op in received[1:] if isinstance(op, ops.Deliver)
            for m in op.messages] == [4]
    assert hub.statistics().subscriptions == 1


def test_a_member_that_forgot_no_subject_waits_in_silence_for_one_it_has_not_numbered() -> None:
    """It lags (restarted, or just added: where a member's clients resume when it leaves):
    nothing was missed, so no DATA_RESYNC (was: DATA_RESYNC at once, then DATA_SYNC once
    caught up; tests/cluster/test_cluster_lagging_resume.py with real members)."""
    hub = Hub(epoch=1, numbered_elsewhere=True)
    sink = OpSink()
    answer = hub.subscribe(sink, ops.SubscriptionRequest("/a/b", Position(9, 2)), 0.0)
    assert statuses(answer) == [(ops.Status.SUBSCRIBE_ALLOW, None)]
    for seq in (1, 2, 3):
        hub.apply(Message("/a/b", str(seq).encode(), epoch=9, seq=seq), 0.0)
    synced, live = sink.received()
    assert synced == ops.SubjectStatus(ops.Status.DATA_SYNC, "/a/b", Position(9, 2))
    assert isinstance(live, ops.Deliver) and [m.seq for m in live.messages] == [3]


def test_a_member_that_forgot_other_subjects_still_knows_it_lags_on_this_one() -> None:
    """A member that has run a while has forgotten one-off subjects: a resume of a subject
    it never forgot and has not numbered yet is still a lag, not a resync (``Hub``'s
    ``may_have_forgotten``); one of a subject it forgot is told DATA_RESYNC at once."""
    hub = Hub(epoch=1, cache_expire_seconds=10, numbered_elsewhere=True)
    for i in range(100):
        hub.apply(Message(f"/one/off{i}", b"x", epoch=9, seq=1), now=0.0)
    hub.expire(11.0)
    assert hub.statistics().subjects_forgotten == 100
    lagging, forgotten = OpSink(), OpSink()
    answer = hub.subscribe(lagging, ops.SubscriptionRequest("/new/one", Position(9, 1)), 12.0)
    assert statuses(answer) == [(ops.Status.SUBSCRIBE_ALLOW, None)]
    answer = hub.subscribe(forgotten, ops.SubscriptionRequest("/one/off7", Position(9, 1)), 12.0)
    assert statuses(answer) == [(ops.Status.SUBSCRIBE_ALLOW, None), (ops.Status.DATA_RESYNC, None)]
    hub.apply(Message("/new/one", b"1", epoch=9, seq=1), now=13.0)
    synced = ops.SubjectStatus(ops.Status.DATA_SYNC, "/new/one", Position(9, 1))
    assert lagging.received() == [synced]


def test_a_resume_waiting_for_a_forgotten_subject_can_be_unsubscribed() -> None:
    hub = Hub(epoch=1, cache_expire_seconds=10, numbered_elsewhere=True)
    hub.apply(Message("/one/off", b"x", epoch=9, seq=1), now=0.0)
    hub.expire(11.0)
    sink = OpSink()
    hub.subscribe(sink, ops.SubscriptionRequest("/one/off", Position(9, 1)), 12.0)
    hub.unsubscribe(sink, "/one/off")
    assert hub.statistics().subjects == 0 and hub.statistics().subscriptions == 0


def test_a_resume_waiting_for_a_subject_that_comes_back_in_another_epoch_is_resynced() -> None:
    """The cluster lost the subject's lineage (all its Raft state): the snapshot (none
    here) and DATA_RESYNC, as for any resume from an epoch the subject no longer has
    (the message that started the new lineage came before the resume went on)."""
    hub = Hub(epoch=1, numbered_elsewhere=True)
    sink = OpSink()
    hub.subscribe(sink, ops.SubscriptionRequest("/a/b", Position(9, 3)), 0.0)
    sink.frames.clear()
    hub.apply(Message("/a/b", b"new", epoch=12, seq=1), 0.0)
    assert sink.received()[-1] == ops.SubjectStatus(
        ops.Status.DATA_RESYNC, "/a/b", Position(12, 1))


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


def test_forget_unserved_leaves_what_still_serves_and_the_next_epoch_is_new() -> None:
    """Hub.forget_unserved: a snapshot its owner knows serves no one (an MQTT session's
    empty record, mqtt_expiry) does not keep its subject for good."""
    hub = Hub(epoch=7, cache_expire_seconds=10)
    hub.publish(Message("/kept/cached", b"c", retained=True), now=10.0)
    hub.publish(Message("/kept/watched", b"w", retained=True), now=0.0)
    hub.subscribe(Sink(), ops.SubscriptionRequest("/kept/watched"), now=0.0)
    hub.subscribe(Sink(), ops.SubscriptionRequest("/kept/unnumbered"), now=0.0)
    hub.publish(Message("/gone/record", b"r", retained=True), now=0.0)
    hub.expire(11.0)
    assert [hub.forget_unserved(s) for s in hub.subject_names()] == [
        False, False, False, True]
    assert hub.forget_unserved("/never/seen") is False
    assert hub.subject_names() == ["/kept/cached", "/kept/watched", "/kept/unnumbered"]
    assert hub.statistics().subjects_forgotten == 1
    again = hub.publish(Message("/gone/record", b"r2", retained=True), now=12.0)
    assert again.seq == 1 and again.epoch != 7


def test_a_subject_made_again_after_it_was_forgotten_counts_as_made_then() -> None:
    """``Hub.made``: what a Standard member compares with when it met a peer's process
    (``ForwardLineage.met``); a subject made again is made after whatever came before."""
    hub = Hub(epoch=7, cache_expire_seconds=10)
    assert hub.made("/one/off") is None
    hub.publish(Message("/one/off", b"old"), now=0.0)
    hub.subscribe(Sink(), ops.SubscriptionRequest("/kept/watched"), now=0.0)
    assert (hub.made("/one/off"), hub.made("/kept/watched"), hub.holdings_made) == (1, 2, 2)
    hub.expire(11.0)
    assert hub.made("/one/off") is None and hub.made("/kept/watched") == 2
    hub.publish(Message("/one/off", b"new"), now=12.0)
    assert hub.made("/one/off") == hub.holdings_made == 3
