"""The check of the Standard combination tests (``standard_streams.check``) on
hand-made histories: each rule found alone, a clean history passes."""

from __future__ import annotations

from standard_streams import FAILOVER, RESYNC, Got, check

from migratory.model.message import MessageType
from migratory.model.position import Position

ACKED = {"a": [0, 1, 2, 3], "b": [0, 1]}


def got(sender: str, number: int, seq: int, epoch: int = 5) -> Got:
    return Got(sender, number, Position(epoch, seq), MessageType.UPDATE)


def test_every_message_in_order_is_clean() -> None:
    events = [got("a", 0, 1), got("b", 0, 2), got("a", 1, 3), got("b", 1, 4),
              got("a", 2, 5), got("a", 3, 6)]
    assert check(events, ACKED).ok()


def test_a_skip_announced_in_its_window_is_clean() -> None:
    events = [got("a", 0, 1), got("b", 0, 2), RESYNC, got("a", 3, 1, epoch=6),
              got("b", 1, 2, epoch=6)]
    assert check(events, ACKED).ok()


def test_a_skip_without_a_resync_is_unannounced() -> None:
    result = check([got("a", 0, 1), got("a", 3, 2), got("b", 0, 3), got("b", 1, 4)], ACKED)
    assert result.unannounced == ["a:[1, 2] before a:3"] and not result.repeated


def test_a_resync_before_the_senders_last_message_does_not_cover_a_later_skip() -> None:
    events = [got("a", 0, 1), RESYNC, got("a", 1, 1, epoch=6), got("a", 3, 2, epoch=6),
              got("b", 0, 3, epoch=6), got("b", 1, 4, epoch=6)]
    assert check(events, ACKED).unannounced == ["a:[2] before a:3"]


def test_a_message_again_on_one_lineage_is_a_repeat() -> None:
    events = [got("a", 0, 1), got("a", 1, 2), got("a", 1, 3), got("a", 2, 4),
              got("a", 3, 5), got("b", 0, 6), got("b", 1, 7)]
    assert check(events, ACKED).repeated == ["a:1 after a:1"]


def test_again_after_a_failover_resync_is_no_repeat() -> None:
    events = [got("a", 0, 1), got("a", 1, 2), FAILOVER, RESYNC, got("a", 1, 1, epoch=6),
              got("a", 2, 2, epoch=6), got("a", 3, 3, epoch=6), got("b", 0, 4, epoch=6),
              got("b", 1, 5, epoch=6)]
    assert check(events, ACKED).ok()


def test_a_hole_in_an_epoch_is_found() -> None:
    events = [got("a", 0, 1), got("a", 1, 3), got("a", 2, 4), got("a", 3, 5),
              got("b", 0, 6), got("b", 1, 7)]
    assert check(events, ACKED).positions == [f"{Position(5, 3)} after seq 1"]


def test_acknowledged_messages_never_got_at_the_end_are_missing() -> None:
    result = check([got("a", 0, 1), got("a", 1, 2), got("b", 0, 3), got("b", 1, 4)], ACKED)
    assert result.missing_at_end == ["a:[2, 3]"]
    announced = check([got("a", 0, 1), got("a", 1, 2), got("b", 0, 3), got("b", 1, 4),
                       RESYNC], ACKED)
    assert announced.ok()
