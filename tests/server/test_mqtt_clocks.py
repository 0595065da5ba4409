"""Persistent MQTT sessions and wall clocks that disagree or step (migratory/server/
mqtt_store.py ``saved_at``, mqtt_expiry.py, mqtt_saving.py): members of one cluster share
one hub here, each member's sweep and clock played in turn (mqtt_store.wall_clock)."""

from __future__ import annotations

import logging

import pytest
from test_mqtt_expiry import T0, gets_publish, left_session, wall
from test_mqtt_session import make, read, session

from migratory import client_lines
from migratory.client_lines import ClientLines
from migratory.protocol import mqtt
from migratory.protocol.mqtt_encode import encode_packet
from migratory.server.mqtt_expiry import SessionExpiry
from migratory.server.mqtt_store import decode_record, session_subject

__all__ = ["wall"]  # the fixture
EXPIRY = 600  # the least MqttSessionExpiry a cluster takes
HOUR, DAY = 3600, 86400


@pytest.fixture(autouse=True)
def fresh_lines(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(client_lines, "lines", ClientLines())  # no line held from another


@pytest.mark.parametrize("behind", [2, 120, 2 * HOUR])
def test_a_session_connected_to_a_member_whose_clock_is_behind_stays(
    wall: list[float], behind: int, caplog: pytest.LogCaptureFixture
) -> None:
    """Member B, where the client is connected, runs ``behind`` seconds behind member A,
    which sweeps too. 2 s and 2 min: A never discards it. 2 h: every record B saves looks
    2 h old to A, whose sweep discards it each minute; B takes it back whole each time
    and says why (before: B's connection closed as taken over at its next save, and the
    client's next CONNECT found no session)."""
    caplog.set_level(logging.INFO, logger="migratory.mqtt")
    ctx, held = make(MqttSessionExpiry=str(EXPIRY))
    registry: dict = {}
    wall[0] = T0 - behind
    device = session(ctx, "dev", registry, clean_session=False)
    device.receive_data(encode_packet(mqtt.Subscribe(1, (("a/+", 0),))), 0.0)
    held.settle()
    assert gets_publish(ctx, held, registry, device)
    device.receive_data(encode_packet(mqtt.Subscribe(2, (("b/+", 0),))), 0.0)  # saved now
    held.settle()
    kept = decode_record(ctx.hub.snapshot(session_subject("dev")))
    assert kept is not None and kept.positions
    at_b, at_a = SessionExpiry(ctx, registry), SessionExpiry(ctx, {})
    discarded = 0
    for minute in range(1, 16):  # a sweep a minute on each member
        wall[0] = T0 + 60 * minute
        discarded += at_a.sweep(0.0, 100)
        held.settle()
        wall[0] = T0 - behind + 60 * minute
        at_b.sweep(0.0, 100)
        held.settle()
        held.settle()
        record = decode_record(ctx.hub.snapshot(session_subject("dev")))
        assert record is not None, minute
        assert (record.filters, record.positions) == (kept.filters, kept.positions)
        assert not (device.closing or device.aborted), minute
    assert gets_publish(ctx, held, registry, device)
    warnings = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
    if behind < EXPIRY // 2:
        assert (discarded, ctx.stats.mqtt_sessions_reclaimed, warnings) == (0, 0, [])
    else:
        assert discarded == ctx.stats.mqtt_sessions_reclaimed >= 10
        assert len(warnings) == 1  # then at DEBUG, counted in the next line
        assert "another member's expiry sweep discarded this connected session" in \
            warnings[0] and "ahead of this one's by about 300 s or more" in warnings[0]


@pytest.mark.parametrize(("step", "kept"), [(-HOUR, True), (HOUR, True), (DAY, False)])
def test_a_left_session_when_the_members_clock_steps(
    wall: list[float], step: int, kept: bool
) -> None:
    """The client went away at T0; 10 minutes later the member's clock steps. Expiry 2 h.
    Back an hour: kept an hour longer. Forward an hour: kept. Forward a day: discarded
    at the next sweep -- its saved_at is a day old by this clock (a limit, documented:
    nothing but the wall clock dates a record a member did not see saved)."""
    ctx, held = make(MqttSessionExpiry=str(2 * HOUR))
    registry: dict = {}
    left_session(ctx, held, registry)
    expiry = SessionExpiry(ctx, registry)
    wall[0] = T0 + 600 + step
    assert expiry.sweep(0.0, 100) == (0 if kept else 1)
    held.settle()
    back = session(ctx, "dev", registry, clean_session=False)
    assert read(back) == [mqtt.Connack(kept, 0)]


@pytest.mark.parametrize(("ahead", "later", "later_stands"), [
    (2, 3, True), (120, 60, False), (120, 180, True), (2 * HOUR, HOUR, False),
])
def test_two_standard_take_ups_are_ordered_by_the_members_clocks(
    wall: list[float], ahead: int, later: int, later_stands: bool
) -> None:
    """A limit, pinned (docs/mqtt.md "The later take-up stands"): member A, ``ahead``
    seconds ahead, takes the session up at T0; member B, which has not got A's record,
    ``later`` seconds later. Each generation is at least its member's wall-clock
    millisecond, so B's stands only if it came more than the skew later."""
    from migratory.server.mqtt_store import SessionRecord, take_up

    stored = SessionRecord({"a/+": 1}, generation=1, lineage=1).message("dev")
    wall[0] = T0 + ahead
    on_a = take_up(stored, "dev", persistent=True, standard=True).record
    wall[0] = T0 + later
    on_b = take_up(stored, "dev", persistent=True, standard=True).record
    assert on_a is not None and on_b is not None
    assert (on_b.generation > on_a.generation) is later_stands
