from typing import Any

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from migratory.model.conflation import Conflator, fold, offer_run_to, offer_to, round_conflation_ms
from migratory.model.field_timeline import FieldTimeline
from migratory.model.message import Message, MessageType
from migratory.model.snapshot import merge_snapshot

IBM = "/Stocks/NYSE/IBM"


def clock(hms: str) -> float:
    hours, minutes, seconds = (int(part) for part in hms.split(":"))
    return float(hours * 3600 + minutes * 60 + seconds)


@pytest.mark.parametrize(
    ("requested", "rounded"),
    [(0, 0), (78, 0), (99, 0), (100, 100), (547, 500), (887, 800), (5000, 5000), (5099, 5000)],
)
def test_round_conflation_ms(requested: int, rounded: int) -> None:
    assert round_conflation_ms(requested) == rounded


def test_round_conflation_rejects_negative() -> None:
    with pytest.raises(ValueError):
        round_conflation_ms(-1)


def test_seed_conflation_table() -> None:
    # Seed Table 5.1: Examples of Conflated Messages (5-second conflation).
    first = Message(IBM, b"193", {"volume": "6.62M"}, retained=True, epoch=4, seq=1)  # 10:12:00
    second = Message(IBM, b"192", {"bid": "194"}, retained=True, epoch=4, seq=2)  # 10:12:32
    snapshot = merge_snapshot(merge_snapshot(None, first), second)
    assert snapshot is not None
    # 10:12:40 — the client subscribes and first gets the snapshot.
    assert (snapshot.content, dict(snapshot.fields), snapshot.type) == (
        b"192",
        {"volume": "6.62M", "bid": "194"},
        MessageType.SNAPSHOT,
    )

    conflator = Conflator(period_ms=round_conflation_ms(5000), start=clock("10:12:40"))
    assert conflator.next_deadline == clock("10:12:45")
    conflator.offer(Message(IBM, b"195", {"ask": "192"}, retained=True, epoch=4, seq=3))
    assert conflator.poll(clock("10:12:41")) is None  # aggregated in memory
    conflator.offer(Message(IBM, b"196", {"bid": "197"}, retained=True, epoch=4, seq=4))
    assert conflator.poll(clock("10:12:43")) is None  # aggregated in memory

    conflated = conflator.poll(clock("10:12:45"))
    assert conflated == Message(
        IBM,
        b"196",
        {"ask": "192", "bid": "197"},
        retained=True,
        epoch=4,
        seq=4,
        type=MessageType.UPDATE,
    )
    assert conflator.next_deadline == clock("10:12:50")
    assert conflator.poll(clock("10:12:50")) is None  # no new messages
    assert conflator.poll(clock("10:12:55")) is None  # no new messages
    assert conflator.next_deadline == clock("10:13:00")


def test_fields_are_per_period_only() -> None:
    conflator = Conflator(period_ms=1000, start=0.0)
    conflator.offer(Message(IBM, b"1", {"a": "1"}, seq=1))
    assert conflator.poll(1.0) is not None
    conflator.offer(Message(IBM, b"2", {"b": "2"}, seq=2))
    conflator.offer(Message(IBM, b"3", {"b": "3"}, seq=3))
    conflated = conflator.poll(2.0)
    assert conflated is not None
    assert (conflated.content, conflated.seq, dict(conflated.fields)) == (b"3", 3, {"b": "3"})


def test_the_union_of_fields_stays_within_max_size() -> None:
    # within the bound the union is whole; a message whose fields would pass it starts
    # the union again from its own fields (later ones then merge as before)
    conflator = Conflator(period_ms=1000, start=0.0, max_size=44)
    conflator.offer(Message(IBM, b"1", {"ask": "192"}, seq=1))  # subject, content: 17 bytes
    conflator.offer(Message(IBM, b"2", {"ask": "193", "bid": "194"}, seq=2))  # 17 + 12
    conflator.offer(Message(IBM, b"3", {"ask": "195"}, seq=3))
    conflated = conflator.poll(1.0)
    assert conflated is not None and dict(conflated.fields) == {"ask": "195", "bid": "194"}
    conflator.offer(Message(IBM, b"4", {"ask": "1", "bid": "2"}, seq=4))
    conflator.offer(Message(IBM, b"5", {"volume": "6.62M", "open": "190.5"}, seq=5))  # 45
    conflator.offer(Message(IBM, b"6", {"ask": "3"}, seq=6))  # 17 + 20 + 4
    conflated = conflator.poll(2.0)
    assert conflated is not None
    assert dict(conflated.fields) == {"volume": "6.62M", "open": "190.5", "ask": "3"}
    assert conflated.size() <= 44


def test_deadline_skips_whole_periods_from_start() -> None:
    conflator = Conflator(period_ms=500, start=10.0)
    conflator.offer(Message(IBM, b"1", seq=1))
    assert conflator.poll(10.49) is None
    assert conflator.has_pending
    late = conflator.poll(12.2)
    assert late is not None and not conflator.has_pending
    assert conflator.next_deadline == pytest.approx(12.5)
    assert conflator.poll(12.49) is None


def test_deadline_does_not_drift_over_many_periods() -> None:
    conflator = Conflator(period_ms=100, start=0.0)
    for k in range(1, 10_001):
        conflator.poll(conflator.next_deadline)
        assert conflator.next_deadline == pytest.approx((k + 1) * 0.1)


def test_conflated_message_is_update_and_rejects_other_subject() -> None:
    conflator = Conflator(period_ms=100, start=0.0)
    conflator.offer(Message(IBM, b"1", seq=1, type=MessageType.RECOVERED))
    with pytest.raises(ValueError):
        conflator.offer(Message("/Other/X", b"1"))
    conflated = conflator.poll(0.1)
    assert conflated is not None and conflated.type is MessageType.UPDATE


def test_period_must_be_positive() -> None:
    with pytest.raises(ValueError):
        Conflator(period_ms=0, start=0.0)


# --- a run of messages offered at once (a cache sync's jump: Hub._catch_up_live) ---

names = st.sampled_from(["a", "b", "cc", "dé", "eee"])
values = st.sampled_from(["", "1", "22", "ü4"])
run_messages = st.lists(
    st.tuples(st.binary(max_size=4), st.dictionaries(names, values, max_size=3)),
    min_size=1, max_size=12,
)
before_run = st.lists(
    st.one_of(st.tuples(st.just("publish"), st.tuples(st.binary(max_size=4),
                                                       st.dictionaries(names, values,
                                                                       max_size=3))),
              st.tuples(st.just("subscribe"), st.sampled_from([1, 2, 5])),
              st.tuples(st.just("tick"), st.just(None))),
    max_size=20,
)


def conflators_after(max_size: int, steps: list[tuple[str, Any]]) -> tuple[
        list[Conflator], float, int]:
    """Conflators of one subject, sharing a timeline, after ``steps`` (some with a union
    pending, some not), the clock and the last seq."""
    conflators: list[Conflator] = []
    now, seq = 0.0, 0
    for kind, arg in steps:
        now += 0.1
        if kind == "publish":
            seq += 1
            offer_to(conflators, Message(IBM, arg[0], arg[1], seq=seq), now)
        elif kind == "subscribe":
            conflators.append(Conflator(
                period_ms=100 * arg, start=now, max_size=max_size,
                timeline=conflators[0].timeline if conflators else None))
        for conflator in conflators:
            conflator.poll(now)
    return conflators, now, seq


def emitted(conflators: list[Conflator], now: float) -> list[tuple[object, ...] | None]:
    """What each emits at ``now``, its fields in their order (the bytes encode them so)."""
    return [None if m is None else (m.content, m.seq, m.type, list(m.fields.items()))
            for m in (c.poll(now) for c in conflators)]


@settings(max_examples=300, deadline=None)
@example(max_size=0, steps=[("subscribe", 1)], run=[(b"1", {"a": "1", "b": "22"}),
                                                    (b"2", {"cc": "1", "a": "ü4"})],
         after=[])
@given(max_size=st.sampled_from([0, 16, 24, 40, 131072]), steps=before_run,
       run=run_messages, after=st.lists(run_messages, max_size=3))
def test_a_run_offered_folded_emits_what_it_offered_one_at_a_time_emits(
    max_size: int, steps: list[tuple[str, Any]], run: list[tuple[bytes, dict[str, str]]],
    after: list[list[tuple[bytes, dict[str, str]]]],
) -> None:
    """The same conflators, the run offered one message at a time (offer_to, as before)
    or at once (offer_run_to: folded when no union can pass max_size along it): each
    emits the same at every later deadline -- content, position, fields in their order --
    through the runs that follow too."""
    one_at_a_time, now, seq = conflators_after(max_size, steps)
    at_once, _, _ = conflators_after(max_size, steps)
    missed = [Message(IBM, content, fields, seq=seq + i)
              for i, (content, fields) in enumerate(run, 1)]
    now += 0.05
    for message in missed:
        offer_to(one_at_a_time, message, now)
    offer_run_to(at_once, missed, now)
    seq += len(missed)
    for later in [[], *after]:
        now += 0.25
        for content, fields in later:
            seq += 1
            offer_to(one_at_a_time, Message(IBM, content, fields, seq=seq), now)
            offer_to(at_once, Message(IBM, content, fields, seq=seq), now)
        assert emitted(at_once, now) == emitted(one_at_a_time, now)
    assert emitted(at_once, now + 1) == emitted(one_at_a_time, now + 1)


def test_the_fold_is_the_seed_table_s_merge() -> None:
    # Seed Table 5.1's two messages of one period, folded: the conflated message it shows
    first = Message(IBM, b"195", {"ask": "192"}, retained=True, epoch=4, seq=3)
    second = Message(IBM, b"196", {"bid": "197"}, retained=True, epoch=4, seq=4)
    assert fold([first, second]) == Message(IBM, b"196", {"ask": "192", "bid": "197"},
                                            retained=True, epoch=4, seq=4)
    # a field set again goes where its last setter puts it, as the timeline orders it
    again = Message(IBM, b"197", {"ask": "193"}, epoch=4, seq=5)
    assert list(fold([first, second, again]).fields) == ["bid", "ask"]
    assert fold([second]) is second


def test_a_run_is_offered_once_to_each_conflator(monkeypatch: pytest.MonkeyPatch) -> None:
    """50 conflators and a run of 400: 20,000 offers one at a time, now 50 -- or one at
    a time again where a union could pass max_size along the run."""
    offered = []
    real = Conflator.offered

    def counted(self: Conflator, now: float | None = None) -> None:
        offered.append(self)
        real(self, now)

    monkeypatch.setattr(Conflator, "offered", counted)
    run = [Message(IBM, b"x" * 10, {"bid": str(i)}, seq=i) for i in range(1, 401)]
    for max_size, offers in ((0, 50), (131072, 50), (1000, 20_000)):
        offered.clear()
        timeline = FieldTimeline()
        conflators = [Conflator(period_ms=500, start=0.0, max_size=max_size,
                                timeline=timeline) for _ in range(50)]
        offer_run_to(conflators, run, 0.1)
        assert len(offered) == offers
        assert all(dict(c.poll(0.5).fields) == {"bid": "400"} for c in conflators)  # type: ignore[union-attr]
