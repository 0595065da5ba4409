"""What a resumed persistent MQTT session (migratory/server/mqtt_resume.py) catches up from
its record, on a cluster member's hub (positions numbered elsewhere) with caches a
CacheMemoryBudget or MaxCachedMessagesPerSubject empties: every message after the saved
position, or the snapshot with RETAIN (counted in mqtt_resyncs) -- never the next live
message with nothing before it. The shapes of seed 1176's loss (docs/chaos.md: 14 QoS 1
messages of five subjects an MQTT session resumed on a non-seed never got, with no
RETAIN). Bytes in, packets out; the record stored as a member's hub holds it."""

from __future__ import annotations

import json
import logging

import pytest
from test_mqtt_session import HeldPublishing, Wire, read

from migratory import client_lines
from migratory.config import Config
from migratory.entitlement import entitlement_from_config
from migratory.model.message import Message, Qos
from migratory.protocol import mqtt
from migratory.protocol.mqtt_encode import encode_packet
from migratory.server.context import ServerContext, ServerStatistics
from migratory.server.hub import Hub
from migratory.server.mqtt_session import MqttSession
from migratory.server.mqtt_store import GENERATION, SAVED_AT, SESSION_CLOSURE, session_subject

SUBJECT = "/a/b"
EPOCH = 5  # the cluster's lineage of SUBJECT (a member's hub is at epoch 1)


def member(seq: int, *, cached: int = 3, budget: int = 0, retained: bool = True
           ) -> ServerContext:
    """A cluster member's context whose hub applied ``seq`` guaranteed messages of SUBJECT
    (``retained``; ``cached`` kept at most; ``budget``: a CacheMemoryBudget)."""
    hub = Hub(epoch=1, numbered_elsewhere=True, max_cached_messages=cached,
              cache_memory_budget=budget)
    config = Config.from_mapping({})
    ctx = ServerContext(config, hub, entitlement_from_config(config), ServerStatistics(),
                        HeldPublishing(hub))
    for n in range(1, seq + 1):
        hub.apply(message(n, retained=retained), 0.0)
    return ctx


def message(seq: int, epoch: int = EPOCH, *, retained: bool = True) -> Message:
    return Message(SUBJECT, b"m%d" % seq, retained=retained, qos=Qos.GUARANTEED,
                   epoch=epoch, seq=seq)


def store(ctx: ServerContext, positions: dict[str, str]) -> None:
    """The record of client "dev" as the member's hub holds it: filter a/b at QoS 1, and
    ``positions`` (field -> ``lineage:epoch:seq``) -- saved by a connection elsewhere."""
    head = json.dumps({"generation": 1, "lineage": 1, "filters": {"a/b": 1},
                       "positions": {}}).encode()
    ctx.hub.publish(Message(session_subject("dev"), head,
                            {SAVED_AT: "1795914900", GENERATION: "1", **positions},
                            retained=True, qos=Qos.GUARANTEED, closure=SESSION_CLOSURE), 0.0)


def resume(ctx: ServerContext) -> tuple[MqttSession, list[tuple[bytes, bool]]]:
    """The client's persistent CONNECT, its catch-up done: what it was sent."""
    device = MqttSession(ctx, Wire(), "127.0.0.1:1", {})  # type: ignore[arg-type]
    device.receive_data(encode_packet(mqtt.Connect("dev", clean_session=False)), 0.0)
    while device.process(0.0, 1000):
        pass
    packets = read(device)
    assert packets[0] == mqtt.Connack(True, 0)
    return device, publishes(packets)


def publishes(packets: list[mqtt.Packet]) -> list[tuple[bytes, bool]]:
    return [(p.payload, p.retain) for p in packets if isinstance(p, mqtt.Publish)]


def live(ctx: ServerContext, device: MqttSession, seq: int) -> list[tuple[bytes, bool]]:
    ctx.hub.apply(message(seq), 0.0)
    return publishes(read(device))


@pytest.mark.parametrize("field", [None, "1:5"], ids=["forgotten", "damaged"])
def test_an_exact_filter_the_record_names_no_position_of_is_replayed_from_its_cache(
    field: str | None,
) -> None:
    """The record names filter a/b and no (readable) position of /a/b: replayed from the
    start of its cache, as docs/mqtt.md says of a damaged position. Before: not caught up
    at all -- nothing at the resume, then m4 alone (m1..m3 silently skipped)."""
    ctx = member(3)
    store(ctx, {} if field is None else {SUBJECT: field})
    device, sent = resume(ctx)
    assert sent == [(b"m1", False), (b"m2", False), (b"m3", False)]
    assert live(ctx, device, 4) == [(b"m4", False)]


def test_an_exact_filter_the_record_names_no_position_of_resyncs_past_the_cache() -> None:
    """The same where the cache no longer reaches seq 1 (seed 1176: a budget of 20,000
    bytes over 56 subjects): the snapshot with RETAIN, counted. Before: nothing, then
    m11 after a gap of 10 messages the client could not see."""
    ctx = member(10)
    store(ctx, {})
    device, sent = resume(ctx)
    assert sent == [(b"m10", True)]
    assert ctx.stats.mqtt_resyncs == 1
    assert live(ctx, device, 11) == [(b"m11", False)]


# --- the other shapes looked at for seed 1176: each resyncs or replays, none is silent ---

def test_a_position_behind_what_the_budget_left_resyncs() -> None:
    """CacheMemoryBudget emptied the cache (1 byte: every message evicted at once): the
    last seq seen survives, so a position behind it is a resync, not 'up to date'."""
    ctx = member(10, cached=1000, budget=1)
    assert ctx.hub.missed(SUBJECT, message(10).position) == []
    store(ctx, {SUBJECT: f"1:{EPOCH}:7"})
    device, sent = resume(ctx)
    assert sent == [(b"m10", True)] and ctx.stats.mqtt_resyncs == 1
    assert live(ctx, device, 11) == [(b"m11", False)]


def test_a_position_at_the_member_s_own_is_up_to_date_even_with_an_empty_cache() -> None:
    ctx = member(10, cached=1000, budget=1)
    store(ctx, {SUBJECT: f"1:{EPOCH}:10"})
    device, sent = resume(ctx)
    assert sent == [] and ctx.stats.mqtt_resyncs == 0
    assert live(ctx, device, 11) == [(b"m11", False)]


def test_a_position_of_another_lineage_resyncs() -> None:
    """A position saved from another numbering (another epoch of the subject)."""
    ctx = member(10, cached=1000)
    store(ctx, {SUBJECT: "1:99:10"})
    device, sent = resume(ctx)
    assert sent == [(b"m10", True)] and ctx.stats.mqtt_resyncs == 1
    assert live(ctx, device, 11) == [(b"m11", False)]


def test_a_member_behind_the_position_sends_nothing_twice_and_nothing_is_lost() -> None:
    """A member that lags the saved position (a non-seed still catching up): what it
    applies up to the position is not sent again, what follows is."""
    ctx = member(4, cached=1000)
    store(ctx, {SUBJECT: f"1:{EPOCH}:6"})
    device, _ = resume(ctx)
    assert live(ctx, device, 5) + live(ctx, device, 6) == []
    assert live(ctx, device, 7) == [(b"m7", False)]


def test_a_member_that_has_not_numbered_the_subject_yet_sends_what_follows() -> None:
    """A member restarted with nothing of the subject yet (its hub unnumbered, epoch 1):
    the resume cannot tell (counted), and every message it then applies past the saved
    position is sent, none before."""
    ctx = member(0)
    store(ctx, {SUBJECT: f"1:{EPOCH}:2"})
    device, sent = resume(ctx)
    assert sent == [(b"", True)] and ctx.stats.mqtt_resyncs == 1  # told: reset, no snapshot
    assert [live(ctx, device, n) for n in (1, 2, 3)] == [[], [], [(b"m3", False)]]


def test_a_resync_with_no_snapshot_is_told_with_an_empty_retain(
    caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch,
) -> None:
    """What the reruns of seed 1176's shape lost (seeds 1181-1183: subjects whose first
    messages were not retained, their cache emptied by the budget): the resume resyncs,
    there is no snapshot -- and nothing was sent, MQTT has no other sign: the client
    silently missed m3..m10 (628d5cc only said so in the line). Now an empty PUBLISH
    with RETAIN (MQTT's "no retained value") at the granted QoS 1 tells it, counted in
    mqtt_resyncs; acknowledged, the record moves to the subject's position, so the next
    resume is up to date rather than told again."""
    monkeypatch.setattr(client_lines, "lines", client_lines.ClientLines())
    ctx = member(10, retained=False)
    store(ctx, {SUBJECT: f"1:{EPOCH}:2"})
    device = MqttSession(ctx, Wire(), "127.0.0.1:1", {})  # type: ignore[arg-type]
    with caplog.at_level(logging.INFO, logger="migratory.mqtt"):
        device.receive_data(encode_packet(mqtt.Connect("dev", clean_session=False)), 0.0)
        while device.process(0.0, 1000):
            pass
    packets = read(device)
    assert packets[0] == mqtt.Connack(True, 0)
    (reset,) = packets[1:]  # before: nothing after the CONNACK
    assert isinstance(reset, mqtt.Publish)
    assert (reset.topic, reset.payload, reset.retain, reset.qos) == ("a/b", b"", True, 1)
    assert ctx.stats.mqtt_resyncs == 1
    lines = [r.getMessage() for r in caplog.records]
    assert any("/a/b resumed from its snapshot (the cache no longer reaches back): it has "
               "none, an empty RETAIN sent (reset, no snapshot)" in line for line in lines)
    assert any("1 from their snapshot (1 with none: an empty RETAIN), 0 up to date" in line
               for line in lines)
    assert device._record is not None
    assert device._record.positions[SUBJECT] == message(2).position  # not acknowledged
    device.receive_data(encode_packet(mqtt.Puback(reset.packet_id)), 0.0)
    assert device._record.positions[SUBJECT] == message(10).position
    assert live(ctx, device, 11) == [(b"m11", False)]


def test_an_empty_snapshot_is_told_as_no_snapshot() -> None:
    """The subject's last retained message was empty (MQTT's deletion of a retained
    value): no snapshot is sent for it, so the resync is the empty RETAIN, once."""
    ctx = member(10, retained=False)
    ctx.hub.apply(Message(SUBJECT, b"", retained=True, qos=Qos.GUARANTEED, epoch=EPOCH,
                          seq=11), 0.0)
    store(ctx, {SUBJECT: f"1:{EPOCH}:2"})
    device, sent = resume(ctx)
    assert sent == [(b"", True)] and ctx.stats.mqtt_resyncs == 1  # before: []
    assert live(ctx, device, 12) == [(b"m12", False)]


def test_a_snapshot_resync_carries_the_session_on_from_the_subjects_position() -> None:
    """A resync told with the snapshot: the session (and, once the QoS 1 snapshot is
    acknowledged, its record) carries on from where the subject is, as a native client
    does from its DATA_RESYNC's position (docs/protocol.md). Before, both stayed at the
    snapshot's own seq (m2 here): the next resume sent m3 and m4, the non-retained
    messages between it and the subject's position -- late, on another connection, and
    only if no live message came first (h133)."""
    ctx = member(2, cached=2)  # m1, m2 retained; then m3, m4 not: the cache holds m3, m4
    for n in (3, 4):
        ctx.hub.apply(message(n, retained=False), 0.0)
    store(ctx, {SUBJECT: f"1:{EPOCH}:1"})  # m2 is past the cache's reach: a resync
    device = MqttSession(ctx, Wire(), "127.0.0.1:1", {})  # type: ignore[arg-type]
    device.receive_data(encode_packet(mqtt.Connect("dev", clean_session=False)), 0.0)
    while device.process(0.0, 1000):
        pass
    packets = read(device)
    (snapshot,) = packets[1:]
    assert isinstance(snapshot, mqtt.Publish)
    assert (snapshot.payload, snapshot.retain, snapshot.qos) == (b"m2", True, 1)
    assert ctx.stats.mqtt_resyncs == 1
    device.receive_data(encode_packet(mqtt.Puback(snapshot.packet_id)), 0.0)
    assert device._record is not None
    assert device._record.positions[SUBJECT] == message(4).position  # before: m2's
    assert live(ctx, device, 5) == [(b"m5", False)]
