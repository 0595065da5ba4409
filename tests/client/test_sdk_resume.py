"""SubjectTracker: dedupe, gap detection and resume positions, without I/O."""

import random

from hypothesis import given
from hypothesis import strategies as st

from migratory.model.message import Message, MessageType
from migratory.model.position import Position
from migratory.protocol.ops import Status, SubscriptionRequest
from migratory_client.resume import SubjectTracker, Verdict

SUBJECT = "/a/b"


def msg(seq: int, epoch: int = 7, kind: MessageType = MessageType.UPDATE) -> Message:
    return Message(SUBJECT, str(seq).encode(), epoch=epoch, seq=seq, type=kind)


def allowed(at: Position | None = None, **options: int) -> SubjectTracker:
    tracker = SubjectTracker(SUBJECT, **options)
    tracker.on_status(Status.SUBSCRIBE_ALLOW, at or Position(7, 10))
    return tracker


def test_first_request_asks_for_history_then_resumes() -> None:
    tracker = SubjectTracker(SUBJECT, history=5, conflation_ms=500)
    assert tracker.request() == SubscriptionRequest(SUBJECT, None, 5, 500)
    tracker.on_status(Status.SUBSCRIBE_ALLOW, Position(7, 10))
    # the history has not come yet: a resume now asks for it as of the position
    assert tracker.request() == SubscriptionRequest(SUBJECT, Position(7, 10), 5, 500)
    tracker.on_message(msg(11))
    assert tracker.request() == SubscriptionRequest(SUBJECT, Position(7, 11), 0, 500)


def test_live_updates_in_order_are_delivered() -> None:
    tracker = allowed()
    assert [tracker.on_message(msg(s)) for s in (11, 12, 13)] == [Verdict.DELIVER] * 3
    assert tracker.position == Position(7, 13)


def test_duplicates_are_dropped() -> None:
    tracker = allowed()
    tracker.on_message(msg(11))
    assert tracker.on_message(msg(11)) is Verdict.DUPLICATE
    assert tracker.on_message(msg(3, kind=MessageType.RECOVERED)) is Verdict.DUPLICATE
    assert tracker.position == Position(7, 11)


def test_snapshot_and_historical_pass_through_without_moving() -> None:
    tracker = allowed()
    assert tracker.on_message(msg(10, kind=MessageType.SNAPSHOT)) is Verdict.DELIVER
    assert tracker.position == Position(7, 10)
    history = allowed(history=2)
    assert history.on_message(msg(9, kind=MessageType.HISTORICAL)) is Verdict.DELIVER
    assert history.on_message(msg(10, kind=MessageType.HISTORICAL)) is Verdict.DELIVER
    assert history.position == Position(7, 10)


def test_only_a_subscribes_answer_has_a_snapshot_or_history() -> None:
    # was: every snapshot and historical message delivered, whenever it came: an old
    # message after newer ones, or the same one twice
    tracker = allowed()
    assert tracker.on_message(msg(10, kind=MessageType.SNAPSHOT)) is Verdict.DELIVER
    assert tracker.on_message(msg(10, kind=MessageType.SNAPSHOT)) is Verdict.DUPLICATE
    assert tracker.on_message(msg(4, kind=MessageType.HISTORICAL)) is Verdict.DUPLICATE
    assert tracker.on_message(msg(11)) is Verdict.DELIVER
    assert tracker.on_message(msg(11, kind=MessageType.SNAPSHOT)) is Verdict.DUPLICATE
    late = allowed()
    assert late.on_message(msg(11)) is Verdict.DELIVER
    assert late.on_message(msg(10, kind=MessageType.SNAPSHOT)) is Verdict.DUPLICATE
    history = allowed(history=3)
    assert history.on_message(msg(8, kind=MessageType.SNAPSHOT)) is Verdict.DUPLICATE
    for seq, verdict in (
        (8, Verdict.DELIVER),
        (8, Verdict.DUPLICATE),
        (7, Verdict.DUPLICATE),
        (9, Verdict.DELIVER),
        (10, Verdict.DELIVER),
        (11, Verdict.DUPLICATE),
    ):
        assert history.on_message(msg(seq, kind=MessageType.HISTORICAL)) is verdict
    resumed = allowed()  # a resume: the snapshot comes before DATA_RESYNC, not after it
    resumed.on_status(Status.SUBSCRIBE_ALLOW, None)
    assert resumed.on_message(msg(30, epoch=8, kind=MessageType.SNAPSHOT)) is Verdict.DELIVER
    resumed.on_status(Status.DATA_RESYNC, Position(8, 30))
    assert resumed.on_message(msg(30, epoch=8, kind=MessageType.SNAPSHOT)) is Verdict.DUPLICATE
    assert resumed.on_message(msg(31, epoch=8)) is Verdict.DELIVER


def test_gap_is_reported_once_and_recovered() -> None:
    tracker = allowed()
    assert tracker.on_message(msg(13)) is Verdict.GAP
    assert tracker.request().position == Position(7, 10)
    assert tracker.on_message(msg(14)) is Verdict.DUPLICATE  # comes back as recovered
    tracker.on_status(Status.SUBSCRIBE_ALLOW, Position(7, 14))
    assert tracker.position == Position(7, 10)  # a resume keeps its own position
    for seq in (11, 12, 13, 14):
        assert tracker.on_message(msg(seq, kind=MessageType.RECOVERED)) is Verdict.DELIVER
    tracker.on_status(Status.DATA_SYNC, Position(7, 14))
    assert not tracker.recovering
    assert tracker.on_message(msg(16)) is Verdict.GAP


def test_conflated_subscription_accepts_skips() -> None:
    tracker = allowed(conflation_ms=200)
    assert tracker.on_message(msg(15)) is Verdict.DELIVER
    assert tracker.on_message(msg(14)) is Verdict.DUPLICATE
    assert not allowed(conflation_ms=99).conflated


def test_resync_to_a_new_epoch() -> None:
    tracker = allowed()
    tracker.on_message(msg(11))
    tracker.on_status(Status.SUBSCRIBE_ALLOW, Position(99, 3))
    assert tracker.on_message(msg(3, epoch=99, kind=MessageType.SNAPSHOT)) is Verdict.DELIVER
    tracker.on_status(Status.DATA_RESYNC, Position(99, 3))
    assert tracker.position == Position(99, 3)
    assert tracker.on_message(msg(4, epoch=99)) is Verdict.DELIVER


def test_sync_never_moves_back_within_an_epoch() -> None:
    tracker = allowed()
    tracker.on_message(msg(11))
    tracker.on_status(Status.DATA_RESYNC, Position(7, 9))
    assert tracker.position == Position(7, 11)
    assert tracker.on_message(msg(10)) is Verdict.DUPLICATE


def test_message_of_a_new_epoch_is_accepted() -> None:
    tracker = allowed()
    assert tracker.on_message(msg(1, epoch=8)) is Verdict.DELIVER
    assert tracker.position == Position(8, 1)


def test_a_new_epoch_that_does_not_start_at_seq_1_is_a_gap() -> None:
    # A member that moved the subject to another lineage fans the next message out as it
    # is (Hub.apply): delivering it would skip the epoch's messages before it in silence.
    tracker = allowed()
    assert tracker.on_message(msg(5, epoch=8)) is Verdict.GAP
    assert tracker.request().position == Position(7, 10)
    assert tracker.on_message(msg(6, epoch=8)) is Verdict.DUPLICATE  # still recovering
    tracker.on_status(Status.DATA_RESYNC, Position(8, 6))  # the resume's answer
    assert tracker.on_message(msg(7, epoch=8)) is Verdict.DELIVER
    assert tracker.position == Position(8, 7)


def test_a_stale_message_of_an_epoch_left_behind_is_not_delivered() -> None:
    tracker = allowed()
    tracker.on_status(Status.DATA_RESYNC, Position(8, 3))
    assert tracker.on_message(msg(11)) is Verdict.GAP  # epoch 7: no flip-flop back to it
    assert tracker.position == Position(8, 3)
    conflated = allowed(conflation_ms=100)
    assert conflated.on_message(msg(5, epoch=8)) is Verdict.DELIVER  # merged: any seq


def test_an_update_before_the_first_subscribes_answer_is_left() -> None:
    # subscribed again just after an unsubscribe: an update the server sent for the
    # earlier subscription, before it read the unsubscribe, arrives first
    tracker = SubjectTracker(SUBJECT, history=3)
    tracker.sent(session_id=1)
    assert tracker.on_message(msg(11)) is Verdict.DUPLICATE
    tracker.on_status(Status.SUBSCRIBE_ALLOW, Position(7, 11), session_id=1)
    for seq in (9, 10, 11):
        assert tracker.on_message(msg(seq, kind=MessageType.HISTORICAL)) is Verdict.DELIVER
    assert tracker.on_message(msg(12)) is Verdict.DELIVER


def test_a_data_sync_past_messages_never_delivered_is_reported() -> None:
    tracker = allowed()
    tracker.on_message(msg(11))
    assert tracker.on_status(Status.DATA_SYNC, Position(7, 14))  # 12-14 never came
    assert tracker.position == Position(7, 14)
    assert not tracker.on_status(Status.DATA_SYNC, Position(7, 14))
    assert not tracker.on_status(Status.DATA_SYNC, Position(7, 12))  # behind: nothing lost
    assert not tracker.on_status(Status.DATA_RESYNC, Position(7, 20))  # says so itself
    assert not tracker.on_status(Status.DATA_SYNC, Position(8, 0))  # a lineage, empty yet
    assert tracker.on_status(Status.DATA_SYNC, Position(9, 3))
    assert not allowed(conflation_ms=100).on_status(Status.DATA_SYNC, Position(7, 14))


def test_deny() -> None:
    tracker = SubjectTracker(SUBJECT)
    tracker.on_status(Status.SUBSCRIBE_DENY, None)
    assert tracker.denied
    assert tracker.position is None


# --- property: whatever the network does, the application sees 1..N exactly once ----

# A faulty channel: each step either delivers the next live message, loses it,
# or replays an old one (a duplicate, live or recovered).
steps = st.lists(st.sampled_from(["live", "lose", "replay"]), max_size=80)


@given(steps=steps, start=st.integers(0, 5), seed=st.randoms(use_true_random=False))
def test_faulty_stream_is_repaired_exactly_once(
    steps: list[str], start: int, seed: random.Random
) -> None:
    epoch = 42
    tracker = allowed(Position(epoch, start))
    published = start
    delivered: list[int] = []

    def feed(message: Message) -> None:
        verdict = tracker.on_message(message)
        if verdict is Verdict.DELIVER:
            delivered.append(message.seq)
        elif verdict is Verdict.GAP:
            resume(tracker.request().position)

    def resume(position: Position | None) -> None:
        # The server answers a resume: ALLOW, the cached messages after it, DATA_SYNC.
        assert position is not None and position.epoch == epoch
        tracker.on_status(Status.SUBSCRIBE_ALLOW, Position(epoch, published))
        for seq in range(position.seq + 1, published + 1):
            feed(msg(seq, epoch, MessageType.RECOVERED))
        tracker.on_status(Status.DATA_SYNC, Position(epoch, published))

    for step in steps:
        if step == "replay" and published > start:
            kind = seed.choice([MessageType.UPDATE, MessageType.RECOVERED])
            feed(msg(seed.randint(start + 1, published), epoch, kind))
            continue
        published += 1
        if step == "live":
            feed(msg(published, epoch))
    # A reconnect at the end fetches whatever was lost last.
    tracker.on_session_lost()
    resume(tracker.request().position)
    assert delivered == list(range(start + 1, published + 1))


@given(seqs=st.lists(st.integers(1, 30), max_size=60), conflation=st.sampled_from([0, 100]))
def test_delivered_updates_strictly_increase(seqs: list[int], conflation: int) -> None:
    tracker = allowed(Position(1, 0), conflation_ms=conflation)
    delivered = [s for s in seqs if tracker.on_message(msg(s, 1)) is Verdict.DELIVER]
    assert delivered == sorted(set(delivered))
    if not conflation:
        assert delivered == list(range(1, len(delivered) + 1))


def test_a_first_answer_cut_before_its_snapshot_resumes_asking_for_it() -> None:
    # was: the resume from the ALLOW's position asked for nothing more, so the snapshot
    # the first subscribe owed never came
    tracker = allowed()
    tracker.on_session_lost()
    assert tracker.request() == SubscriptionRequest(SUBJECT, Position(7, 10), snapshot=True)
    tracker.on_status(Status.SUBSCRIBE_ALLOW, None)  # the resume's answer, cut again
    tracker.on_session_lost()
    assert tracker.request().snapshot
    tracker.on_status(Status.SUBSCRIBE_ALLOW, None)
    assert tracker.on_message(msg(9, kind=MessageType.SNAPSHOT)) is Verdict.DELIVER
    assert tracker.request() == SubscriptionRequest(SUBJECT, Position(7, 10))


def test_the_snapshot_is_asked_for_only_while_the_first_answer_is_open() -> None:
    updated = allowed()
    updated.on_message(msg(11))  # the answer closed: no snapshot was coming
    assert not updated.request().snapshot
    synced = allowed()
    synced.on_status(Status.DATA_RESYNC, Position(7, 12))
    assert not synced.request().snapshot
    history = allowed(history=3)  # a history subscribe owes no snapshot
    assert not history.request().snapshot
    resumed = SubjectTracker(SUBJECT, position=Position(7, 10))
    resumed.on_status(Status.SUBSCRIBE_ALLOW, None)  # a plain resume owes none either
    assert not resumed.request().snapshot


def test_a_first_answer_cut_inside_its_history_resumes_asking_for_the_rest() -> None:
    # was: the resume asked for no history, so what the cut took never came
    tracker = allowed(history=5)
    for seq in (6, 7):
        assert tracker.on_message(msg(seq, kind=MessageType.HISTORICAL)) is Verdict.DELIVER
    tracker.on_session_lost()
    assert tracker.request() == SubscriptionRequest(SUBJECT, Position(7, 10), 3)
    tracker.on_status(Status.SUBSCRIBE_ALLOW, None)
    got = [tracker.on_message(msg(s, kind=MessageType.HISTORICAL)) for s in (7, 8, 9, 10)]
    assert got == [Verdict.DUPLICATE, Verdict.DELIVER, Verdict.DELIVER, Verdict.DELIVER]
    assert tracker.on_message(msg(11, kind=MessageType.RECOVERED)) is Verdict.DELIVER
    assert tracker.request() == SubscriptionRequest(SUBJECT, Position(7, 11))


def test_a_resumes_snapshot_at_or_before_what_was_delivered_is_not_delivered_again() -> None:
    # was: delivered, old state after newer (a resume's answer may hold a snapshot)
    tracker = allowed()
    assert tracker.on_message(msg(9, kind=MessageType.SNAPSHOT)) is Verdict.DELIVER
    tracker.on_message(msg(11))
    tracker.on_status(Status.SUBSCRIBE_ALLOW, None)  # a resume
    assert tracker.on_message(msg(11, kind=MessageType.SNAPSHOT)) is Verdict.DUPLICATE
    tracker.on_status(Status.SUBSCRIBE_ALLOW, None)
    assert tracker.on_message(msg(30, kind=MessageType.SNAPSHOT)) is Verdict.DELIVER  # newer
    history = allowed(history=2)  # never had a snapshot: any resync's is news
    history.on_message(msg(11))
    history.on_status(Status.SUBSCRIBE_ALLOW, None)
    assert history.on_message(msg(5, kind=MessageType.SNAPSHOT)) is Verdict.DELIVER
