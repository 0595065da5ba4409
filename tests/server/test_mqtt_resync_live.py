"""An MQTT session whose subject a cluster cache sync moved further than its cache reaches
(Hub.reposition -> Hub._catch_up_live): told as docs/mqtt.md says a resync is told --
the snapshot with RETAIN, counted in mqtt_resyncs -- never a plain PUBLISH, never
silently. Bytes in, packets out, an in-process hub that positions come to from outside
(a cluster member's)."""

from __future__ import annotations

import pytest
from test_mqtt_session import HeldPublishing, Wire, read, session

from migratory.config import Config
from migratory.entitlement import entitlement_from_config
from migratory.model.message import Message, Qos
from migratory.model.position import Position
from migratory.protocol import mqtt
from migratory.protocol.mqtt_encode import encode_packet
from migratory.server.context import ServerContext, ServerStatistics
from migratory.server.hub import Hub
from migratory.server.mqtt_session import MqttSession

SUBJECT = "/a/b"
EPOCH = 5
CACHED = 3


def member_hub(seq: int, *, retained: bool) -> Hub:
    """A cluster member's hub that applied ``seq`` guaranteed messages of SUBJECT."""
    hub = Hub(epoch=1, numbered_elsewhere=True, max_cached_messages=CACHED)
    for n in range(1, seq + 1):
        hub.apply(message(n, retained=retained), 0.0)
    return hub


def message(seq: int, *, retained: bool) -> Message:
    return Message(SUBJECT, b"m%d" % seq, retained=retained, qos=Qos.GUARANTEED,
                   epoch=EPOCH, seq=seq)


def subscribed(hub: Hub, *, clean: bool = False, qos: int = 1
               ) -> tuple[ServerContext, MqttSession]:
    """An MQTT session subscribed to SUBJECT with ``qos`` on ``hub``, what it got read."""
    config = Config.from_mapping({})
    ctx = ServerContext(config, hub, entitlement_from_config(config), ServerStatistics(),
                        HeldPublishing(hub))
    device = session(ctx, "dev", {}, clean_session=clean)
    device.receive_data(encode_packet(mqtt.Subscribe(1, (("a/b", qos),))), 0.0)
    ctx.publishing.settle()  # type: ignore[attr-defined]
    read(device)
    return ctx, device


def jump(hub: Hub, to: int, *, retained: bool) -> None:
    """What a cache sync from a peer at ``to`` does to SUBJECT (CACHED messages cached)."""
    ((subject, position, snapshot, run),) = list(member_hub(to, retained=retained).numbered())
    hub.reposition(subject, position, snapshot, run.messages(), 0.0)


def publishes(device: MqttSession) -> list[tuple[bytes, bool]]:
    """What the client gets, once its writer has sent a QoS 1 jump's backlog
    (mqtt_backlog: in its turns of the loop)."""
    while device.refill():
        pass
    return [(p.payload, p.retain) for p in read(device) if isinstance(p, mqtt.Publish)]


def test_a_jump_past_the_cache_is_an_mqtt_resync() -> None:
    hub = member_hub(2, retained=True)
    ctx, device = subscribed(hub)
    hub.apply(message(3, retained=True), 0.0)
    assert publishes(device) == [(b"m3", False)]  # live
    jump(hub, 10, retained=True)  # 4..7 are beyond the cache (8..10)
    # before: [(b"m10", False)], a plain live PUBLISH, and mqtt_resyncs 0
    assert publishes(device) == [(b"m10", True)]
    assert ctx.stats.mqtt_resyncs == 1
    hub.apply(message(11, retained=True), 0.0)
    assert publishes(device) == [(b"m11", False)]  # live again, nothing twice


@pytest.mark.parametrize("qos", [1, 0])
def test_a_jump_past_the_cache_of_a_subject_without_a_snapshot_is_an_empty_retain(
    qos: int,
) -> None:
    """No snapshot to send: before, nothing was sent (counted and logged only) and the
    client silently missed m3..m7. Now an empty PUBLISH with RETAIN -- MQTT's "no
    retained value": the topic's state is reset, there is no snapshot -- at the granted
    QoS, counted as a resync."""
    hub = member_hub(2, retained=False)
    ctx, device = subscribed(hub, clean=True, qos=qos)
    jump(hub, 10, retained=False)
    (reset,) = [p for p in read(device) if isinstance(p, mqtt.Publish)]  # before: none
    assert (reset.topic, reset.payload, reset.retain, reset.qos) == ("a/b", b"", True, qos)
    assert (reset.packet_id is not None) == bool(qos)
    assert ctx.stats.mqtt_resyncs == 1
    hub.apply(message(11, retained=False), 0.0)
    assert publishes(device) == [(b"m11", False)]


def test_a_persistent_session_records_the_reset_once_acknowledged() -> None:
    hub = member_hub(2, retained=False)
    _, device = subscribed(hub)
    jump(hub, 10, retained=False)
    (reset,) = [p for p in read(device) if isinstance(p, mqtt.Publish)]
    assert device._record is not None
    assert device._record.positions[SUBJECT] == Position(EPOCH, 2)
    device.receive_data(encode_packet(mqtt.Puback(reset.packet_id)), 0.0)
    assert device._record.positions[SUBJECT] == Position(EPOCH, 10)


def test_a_jump_the_cache_still_covers_replays_what_it_jumped_over() -> None:
    hub = member_hub(2, retained=True)
    ctx, device = subscribed(hub)
    jump(hub, 5, retained=True)  # 3..5 cached: nothing is lost
    assert publishes(device) == [(b"m3", False), (b"m4", False), (b"m5", False)]
    assert ctx.stats.mqtt_resyncs == 0


def test_a_resuming_session_whose_subject_jumps_is_caught_up_from_its_record() -> None:
    hub = member_hub(2, retained=True)
    ctx, device = subscribed(hub)
    registry: dict = {}
    device.connection_lost()
    ctx.publishing.settle()  # type: ignore[attr-defined]
    back = MqttSession(ctx, Wire(), "127.0.0.1:1", registry)  # type: ignore[arg-type]
    more = back.receive_data(encode_packet(mqtt.Connect("dev", clean_session=False)), 0.0,
                             budget=2)  # the CONNECT, and no slice of the resume yet
    assert more and back.subscriptions.busy
    assert read(back) == [mqtt.Connack(True, 0)]
    jump(hub, 10, retained=True)  # a sync moves the subject past the cache meanwhile
    assert publishes(back) == [(b"m10", True)]  # caught up from its record: a resync
    assert ctx.stats.mqtt_resyncs == 1
    while back.process(0.0, 1000):
        pass
    assert publishes(back) == []  # nothing twice
    hub.apply(message(11, retained=True), 0.0)
    assert publishes(back) == [(b"m11", False)]
    assert ctx.hub.position(SUBJECT) == Position(EPOCH, 11)
