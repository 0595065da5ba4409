"""Persistent MQTT sessions expire (migratory/server/mqtt_expiry.py, MqttSessionExpiry):
the sweep discards a session whose client has been away too long, a CONNECT takes the
expiry as the sweep does, a connected session is saved again rather than discarded."""

from __future__ import annotations

import logging

import pytest
from test_mqtt_session import HeldPublishing, make, read, session

from migratory.protocol import mqtt
from migratory.protocol.mqtt_encode import encode_packet
from migratory.server import mqtt_store
from migratory.server.context import ServerContext
from migratory.server.mqtt_expiry import MAX_SUBJECTS_PER_TICK, SessionExpiry
from migratory.server.mqtt_session import MqttSession
from migratory.server.mqtt_store import (
    EXPIRY_WRITER,
    decode_record,
    discard_message,
    saved_at,
    session_subject,
    stored_generation,
)

EXPIRY = 3600
T0 = 1_800_000_000


@pytest.fixture
def wall(monkeypatch: pytest.MonkeyPatch) -> list[float]:
    now = [float(T0)]
    monkeypatch.setattr(mqtt_store, "wall_clock", lambda: now[0])
    return now


def left_session(
    ctx: ServerContext, held: HeldPublishing, registry: dict, client_id: str = "dev"
) -> None:
    """A persistent session subscribed to a/+ whose client went away at T0."""
    device = session(ctx, client_id, registry, clean_session=False)
    device.receive_data(encode_packet(mqtt.Subscribe(1, (("a/+", 1),))), 0.0)
    held.settle()
    device.connection_lost()
    held.settle()
    assert saved_at(ctx.hub.snapshot(session_subject(client_id))) == T0


def gets_publish(ctx: ServerContext, held: HeldPublishing, registry: dict, s: MqttSession) -> bool:
    publisher = session(ctx, "pub", registry)
    publisher.receive_data(encode_packet(mqtt.Publish("a/b", b"x", qos=1, packet_id=1)), 0.0)
    held.settle()
    return any(isinstance(p, mqtt.Publish) for p in read(s))


def test_a_session_left_alone_past_the_expiry_is_discarded_once(wall: list[float]) -> None:
    ctx, held = make(MqttSessionExpiry=str(EXPIRY))
    registry: dict = {}
    left_session(ctx, held, registry)
    expiry = SessionExpiry(ctx, registry)
    wall[0] = T0 + EXPIRY
    assert expiry.sweep(0.0, 100) == 0 and held.held == []  # not older than the expiry
    wall[0] = T0 + EXPIRY + 1
    ctx.readiness = lambda: "syncing"  # a member that syncs may hold older records
    assert expiry.sweep(0.0, 100) == 0 and held.held == []
    ctx.readiness = lambda: None
    assert expiry.sweep(0.0, 100) == 1
    held.settle()
    subject = session_subject("dev")
    assert decode_record(ctx.hub.snapshot(subject)) is None
    assert saved_at(ctx.hub.snapshot(subject)) is None  # an empty record: not swept again
    assert expiry.sweep(0.0, 100) == 0 and held.held == []
    assert ctx.stats.mqtt_sessions_expired == 1  # GET /stats, migratory_mqtt_sessions_expired
    back = session(ctx, "dev", registry, clean_session=False)
    assert read(back) == [mqtt.Connack(False, 0)]
    assert not gets_publish(ctx, held, registry, back)  # no old subscription


def test_a_session_that_reconnects_at_the_expiry_keeps_everything(wall: list[float]) -> None:
    ctx, held = make(MqttSessionExpiry=str(EXPIRY))
    registry: dict = {}
    left_session(ctx, held, registry)
    wall[0] = T0 + EXPIRY  # the same second as the expiry: still kept
    back = session(ctx, "dev", registry, clean_session=False)
    assert read(back) == [mqtt.Connack(True, 0)]
    assert gets_publish(ctx, held, registry, back)
    assert ctx.stats.mqtt_sessions_expired == 0


def test_a_connect_past_the_expiry_before_any_sweep_gets_a_fresh_session(
    wall: list[float],
) -> None:
    ctx, held = make(MqttSessionExpiry=str(EXPIRY))
    registry: dict = {}
    left_session(ctx, held, registry)
    wall[0] = T0 + EXPIRY + 1
    back = session(ctx, "dev", registry, clean_session=False)
    assert read(back) == [mqtt.Connack(False, 0)]
    held.settle()  # the fresh, empty record replaces the expired one at once
    assert decode_record(ctx.hub.snapshot(session_subject("dev"))) is None
    assert not gets_publish(ctx, held, registry, back)
    assert ctx.stats.mqtt_sessions_expired == 1


def test_a_connect_racing_the_sweeps_discard_gets_a_whole_fresh_session(
    wall: list[float],
) -> None:
    """The sweep's discard is published but not applied yet (a cluster's commit) when
    the client connects: the CONNECT takes the expiry too (session present 0), and what
    the client subscribes then is saved over the discard."""
    ctx, held = make(MqttSessionExpiry=str(EXPIRY))
    registry: dict = {}
    left_session(ctx, held, registry)
    wall[0] = T0 + EXPIRY + 1
    assert SessionExpiry(ctx, registry).sweep(0.0, 100) == 1
    assert SessionExpiry(ctx, registry).sweep(0.0, 100) == 1  # a second member: the same
    assert held.held[0] == held.held[1]
    back = session(ctx, "dev", registry, clean_session=False)
    assert read(back) == [mqtt.Connack(False, 0)]
    back.receive_data(encode_packet(mqtt.Subscribe(2, (("c/+", 1),))), 0.0)
    held.settle()
    held.settle()
    record = decode_record(ctx.hub.snapshot(session_subject("dev")))
    assert record is not None and record.filters == {"c/+": 1}  # the new one, whole


def test_a_connected_session_is_saved_again_never_discarded(wall: list[float]) -> None:
    ctx, held = make(MqttSessionExpiry=str(EXPIRY))
    registry: dict = {}
    device = session(ctx, "dev", registry, clean_session=False)
    device.receive_data(encode_packet(mqtt.Subscribe(1, (("a/+", 1),))), 0.0)
    held.settle()
    expiry = SessionExpiry(ctx, registry)
    wall[0] = T0 + EXPIRY // 2
    assert expiry.sweep(0.0, 100) == 0 and held.held == []
    wall[0] = T0 + EXPIRY // 2 + 1  # older than half the expiry: saved again
    assert expiry.sweep(0.0, 100) == 0
    held.settle()
    assert saved_at(ctx.hub.snapshot(session_subject("dev"))) == T0 + EXPIRY // 2 + 1
    wall[0] = T0 + 2 * EXPIRY  # the member saw no sweep for long: still not discarded
    assert expiry.sweep(0.0, 100) == 0
    held.settle()
    assert decode_record(ctx.hub.snapshot(session_subject("dev"))) is not None


def test_the_sweep_looks_at_a_budget_of_subjects_per_call(wall: list[float]) -> None:
    ctx, held = make(MqttSessionExpiry=str(EXPIRY))
    registry: dict = {}
    for i in range(3):
        left_session(ctx, held, registry, f"dev{i}")
    wall[0] = T0 + EXPIRY + 1
    expiry = SessionExpiry(ctx, registry)
    found = [expiry.sweep(0.0, 1) for _ in range(ctx.hub.subject_count)]
    assert max(found) == 1 and sum(found) == 3
    assert SessionExpiry.budget(1_000_000, 0.1) == 1667  # every subject once a minute
    assert SessionExpiry.budget(10_000_000, 0.1) == MAX_SUBJECTS_PER_TICK
    assert SessionExpiry.budget(0, 0.1) == 1


def test_expiry_zero_keeps_sessions_for_ever(wall: list[float]) -> None:
    ctx, held = make(MqttSessionExpiry="0", MqttMaxSessions="10")  # the sweep counts
    registry: dict = {}
    left_session(ctx, held, registry)
    online = session(ctx, "online", registry, clean_session=False)
    online.receive_data(encode_packet(mqtt.Subscribe(1, (("a/+", 1),))), 0.0)
    held.settle()
    wall[0] = T0 + 10 * 365 * 86400
    assert SessionExpiry(ctx, registry).sweep(0.0, 100) == 0
    assert held.held == []  # nor is a connected one saved again
    back = session(ctx, "dev", registry, clean_session=False)
    assert read(back) == [mqtt.Connack(True, 0)]


def test_a_connected_session_whose_generation_another_members_sweep_discarded_is_kept(
    wall: list[float],
) -> None:
    """Clocks apart: a member's sweep discarded the record, one generation on from the
    record it saw, while the client took it up here (session present 1) with that same
    generation. The sweep's discard ranks below the connection's saves (EXPIRY_WRITER):
    applied after them it leaves the record whole (before: it emptied it, until this
    member's next sweep saved it again); applied before, the next save writes it whole."""
    for discard_first in (False, True):  # applied before or after the connection's save
        ctx, held = make(MqttSessionExpiry=str(EXPIRY))
        registry: dict = {}
        left_session(ctx, held, registry)
        stale = ctx.hub.snapshot(session_subject("dev"))
        discard = discard_message("dev", stored_generation(stale) + 1, stale,
                                  writer=EXPIRY_WRITER)
        back = session(ctx, "dev", registry, clean_session=False)
        assert read(back) == [mqtt.Connack(True, 0)]
        if discard_first:
            held.local.submit(discard, None, 0.0)  # the other member's, applied first
        held.settle()
        if not discard_first:
            held.local.submit(discard, None, 0.0)  # applied last
        record = decode_record(ctx.hub.snapshot(session_subject("dev")))
        assert record is not None and record.filters == {"a/+": 1}, discard_first
    quiet = session(ctx, "quiet", registry, clean_session=False)  # no filters: no saves
    quiet.receive_data(encode_packet(mqtt.Subscribe(1, (("a/+", 1),))), 0.0)
    held.settle()
    quiet.receive_data(encode_packet(mqtt.Unsubscribe(2, ("a/+",))), 0.0)
    held.settle()
    assert saved_at(ctx.hub.snapshot(session_subject("quiet"))) is None
    assert SessionExpiry(ctx, registry).sweep(0.0, 100) == 0 and held.held == []


def test_a_connect_that_would_pass_max_sessions_is_refused_naming_the_setting(
    wall: list[float], caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="migratory.mqtt")
    ctx, held = make(MqttSessionExpiry=str(EXPIRY), MqttMaxSessions="2")
    registry: dict = {}
    left_session(ctx, held, registry, "dev0")
    left_session(ctx, held, registry, "dev1")
    expiry = SessionExpiry(ctx, registry)
    for _ in range(3):  # a whole sweep (and the start of the next) counts them
        expiry.sweep(0.0, 100)
    assert ctx.stats.mqtt_sessions_stored == 2  # GET /stats, migratory_mqtt_sessions_stored
    third = session(ctx, "dev2", registry, clean_session=False)
    assert read(third) == [mqtt.Connack(False, mqtt.REFUSED_SERVER_UNAVAILABLE)]
    assert third.closing and "dev2" not in registry
    assert "MqttMaxSessions (2)" in caplog.text
    back = session(ctx, "dev0", registry, clean_session=False)  # has its session: goes on
    assert read(back) == [mqtt.Connack(True, 0)]
    clean = session(ctx, "dev3", registry)  # clean session: no session to keep
    assert read(clean) == [mqtt.Connack(False, 0)]
    wall[0] = T0 + EXPIRY + 1  # dev1 expires: room for one more
    for _ in range(2):  # one sweep discards it (not counted), the next call ends it
        expiry.sweep(0.0, 100)
        held.settle()
    assert ctx.stats.mqtt_sessions_stored == 1
    assert read(session(ctx, "dev2", registry, clean_session=False)) == [mqtt.Connack(False, 0)]
    assert ctx.stats.mqtt_sessions_stored == 2  # counted until the next sweep counts it
    assert read(session(ctx, "dev4", registry, clean_session=False)) == [
        mqtt.Connack(False, mqtt.REFUSED_SERVER_UNAVAILABLE)
    ]


def test_the_count_keeps_the_sessions_created_while_a_sweep_ran(wall: list[float]) -> None:
    ctx, held = make(MqttMaxSessions="10")
    registry: dict = {}
    left_session(ctx, held, registry, "dev0")
    expiry = SessionExpiry(ctx, registry)
    expiry.sweep(0.0, 100)  # a sweep starts and counts dev0
    left_session(ctx, held, registry, "dev1")  # a new subject: not in that sweep
    expiry.sweep(0.0, 100)  # the sweep ends
    assert ctx.stats.mqtt_sessions_stored == 2
    expiry.sweep(0.0, 100)
    assert ctx.stats.mqtt_sessions_stored == 2  # the next one counted both


def test_a_discarded_sessions_subject_is_forgotten_once_its_cache_has_expired(
    wall: list[float],
) -> None:
    """A discarded session leaves an empty record, one generation later, so that a late
    save of an older connection is not taken for the session. Kept for good, every
    client id that ever had a persistent session held a subject on every member:
    benchmarks/soak.py counted 2 more subjects per cycle, 120 after 60 cycles. Once the
    empty record's cache has expired (CacheExpireTime: no save is that late) and its
    client is not connected here, the sweep forgets the subject."""
    ctx, held = make(MqttSessionExpiry=str(EXPIRY), CacheExpireTime="10")
    registry: dict = {}
    for i in range(20):
        left_session(ctx, held, registry, f"dev{i}")
    clean = session(ctx, "dev0", registry)  # a clean session discards dev0's at once
    held.settle()
    wall[0] = T0 + EXPIRY + 1
    expiry = SessionExpiry(ctx, registry)
    assert expiry.sweep(0.0, 100) == 19  # the others expire
    held.settle()
    assert ctx.hub.subject_count == 20  # their empty records, cached (at time 0.0)
    for _ in range(2):
        expiry.sweep(5.0, 100)
    assert ctx.hub.subject_count == 20  # kept while the discard is cached
    ctx.hub.expire(11.0)
    for _ in range(2):
        expiry.sweep(11.0, 100)
    assert ctx.hub.subject_names() == [session_subject("dev0")]  # its client is here
    clean.connection_lost()
    for _ in range(2):
        expiry.sweep(11.0, 100)
    assert ctx.hub.subject_count == 0
    assert ctx.hub.statistics().subjects_forgotten == 20
    back = session(ctx, "dev1", registry, clean_session=False)  # a fresh session
    assert read(back) == [mqtt.Connack(False, 0)]
    back.receive_data(encode_packet(mqtt.Subscribe(1, (("c/+", 1),))), 0.0)
    held.settle()
    record = decode_record(ctx.hub.snapshot(session_subject("dev1")))
    assert record is not None and record.filters == {"c/+": 1} and record.generation == 1


def test_with_expiry_zero_the_sweep_still_forgets_discarded_sessions(
    wall: list[float],
) -> None:
    ctx, held = make(MqttSessionExpiry="0", CacheExpireTime="10")
    registry: dict = {}
    left_session(ctx, held, registry)
    session(ctx, "dev", registry).connection_lost()  # clean: discards the session
    held.settle()
    ctx.hub.expire(11.0)
    expiry = SessionExpiry(ctx, registry)
    for _ in range(2):
        assert expiry.sweep(11.0, 100) == 0
    assert ctx.hub.subject_count == 0
