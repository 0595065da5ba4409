"""The positions a subscriber was told it will not get (``spark_analysis.safety``): one
resync's skip, and the skips a hole may be covered by (joined where they meet)."""

from __future__ import annotations

from spark_analysis.safety import Jump, joined, skip_rows

WHO = ("sdk", "s1", "/chaos/s1")


def resync(seq: int | None, prev: int | None, epoch: int | None = 7,
           prev_epoch: int | None = 7,
           time: float = 1.0) -> Jump:
    return Jump(*WHO, event="DATA_RESYNC", time=time, epoch=epoch, seq=seq,
                prev_epoch=prev_epoch if prev is not None else None, prev_seq=prev)


def test_two_resyncs_in_a_row_cover_the_whole_hole_together() -> None:
    """122 delivered, resync to 149, resync to 158, 159 delivered: 123..158 announced."""
    rows = skip_rows([resync(149, 122), resync(158, 149, time=2.0)])
    assert [r[3:6] for r in rows] == [(7, 122, 149), (7, 149, 158)]
    assert joined(rows) == [(*WHO, 7, 122, 158, None)]


def test_skips_that_do_not_meet_stay_apart() -> None:
    rows = skip_rows([resync(149, 122), resync(158, 150, time=2.0)])  # 150 delivered between
    assert joined(rows) == [(*WHO, 7, 122, 149, None), (*WHO, 7, 150, 158, None)]


def test_an_open_skip_absorbs_what_follows_it_in_its_epoch_only() -> None:
    """A resync into another epoch skips the rest of the old one (open-ended)."""
    rows = skip_rows([resync(5, 40, epoch=9, prev_epoch=7), resync(60, 45, time=2.0)])
    assert sorted(r[3:6] for r in rows) == [(7, 40, None), (7, 45, 60), (9, 0, 5)]
    assert joined(rows) == [(*WHO, 7, 40, None, None), (*WHO, 9, 0, 5, None)]


def test_other_subscribers_and_subjects_are_not_joined() -> None:
    a = skip_rows([resync(149, 122)])
    b = [("sdk", "s2", "/chaos/s1", 7, 149, 158, None),
         ("sdk", "s1", "/chaos/s2", 7, 149, 158, None)]
    assert len(joined([*a, *b])) == 3


def test_a_resync_without_a_position_after_nothing_numbered_skips_every_epoch() -> None:
    """A subscriber at the position of a subject not numbered yet where it subscribed
    ((1, 0)) resumes after the subject's first messages expired and it was forgotten:
    DATA_RESYNC without a position announces every message invoked before it, whatever
    its epoch (chaos seed 43 with CacheExpireTime=1: seq 1 of new epochs reported lost);
    for lost only: holes are judged within one epoch."""
    rows = skip_rows([resync(None, 0, epoch=None, prev_epoch=1, time=3.0)])
    assert sorted(r[3:] for r in rows if r[3] is not None) == [(1, 0, None, 3.0)]
    assert (*WHO, None, 0, None, 3.0) in rows
    assert joined(rows) == [(*WHO, 1, 0, None, None)]


def test_a_resync_without_a_position_after_a_numbered_one_keeps_to_its_epoch() -> None:
    rows = skip_rows([resync(None, 40, epoch=None, prev_epoch=7, time=3.0)])
    assert rows == [(*WHO, 7, 40, None, 3.0)]


def _mqtt_resync(seen: bool) -> Jump:
    return Jump("mqtt", "m1", "/chaos/s48", event="DATA_RESYNC", time=21.2, epoch=None,
                seq=None, prev_epoch=None, prev_seq=None, seen=seen)


def test_an_mqtt_session_that_got_nothing_of_the_subject_is_told_it_all_by_its_resync() -> None:
    """A persistent session subscribed before /chaos/s48 was numbered, dropped before its
    first message came, resumed off the cache: the snapshot (recorded as a DATA_RESYNC
    without a position, MQTT having none) announces every message invoked before it
    (chaos seed 1176 with CacheMemoryBudget=20000: 54 reported lost for two sessions)."""
    assert skip_rows([_mqtt_resync(seen=False)]) == [("mqtt", "m1", "/chaos/s48", None, 0,
                                                      None, 21.2)]
    assert joined(skip_rows([_mqtt_resync(seen=False)])) == []  # for lost only


def test_an_mqtt_session_that_got_a_message_without_a_position_is_not_excused_at_large() -> None:
    """It had a delivery whose position is unknown (its publish never acknowledged): what
    came before that and is missing is not announced by the resync."""
    assert skip_rows([_mqtt_resync(seen=True)]) == []
