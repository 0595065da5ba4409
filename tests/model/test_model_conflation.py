import pytest

from migratory.model.conflation import Conflator, round_conflation_ms
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
