"""What an MQTT session's delivery side holds (mqtt_delivery.py): per subject delivered,
its position, never the message (whose content the hub has dropped since)."""

from __future__ import annotations

import gc
import tracemalloc

from test_mqtt_session import HeldPublishing, make, read, session

from migratory.model.message import Message
from migratory.protocol import mqtt
from migratory.protocol.mqtt_encode import encode_packet
from migratory.server.context import ServerContext
from migratory.server.mqtt_session import MqttSession

SUBJECTS = 300
SIZE = 64 * 1024


def wildcard_sessions(
    ctx: ServerContext, held: HeldPublishing
) -> tuple[MqttSession, MqttSession, MqttSession]:
    """A publisher, then a clean and a persistent session subscribed to 'dev/#' (their
    CONNACK and SUBACK read)."""
    publisher = session(ctx, "pub", {})
    clean = session(ctx, "clean", {})
    persistent = session(ctx, "kept", {}, clean_session=False)
    for device in (clean, persistent):
        device.receive_data(encode_packet(mqtt.Subscribe(1, (("dev/#", 0),))), 0.0)
    held.settle()
    read(clean), read(persistent)
    return publisher, clean, persistent


def test_a_wildcard_session_holds_positions_not_the_messages_the_hub_dropped() -> None:
    """A '#' session, clean or persistent, gets one 64 kB message on each of 300
    subjects; the hub then expires and forgets them all. The sessions kept each
    subject's last message (below PRUNE_FROM subjects nothing is pruned): ~19 MB here,
    ~1 GB for 1,024 subjects of 1 MB messages, out of the hub's cache budget and expiry.
    They now keep positions: the memory left is far less than one message per subject."""
    ctx, held = make(MaxPublishesPerSecond="0", CacheExpireTime="1",
                     MaxMessageSize=str(2 * SIZE), MaxFrameSize=str(4 * SIZE))
    publisher, clean, persistent = wildcard_sessions(ctx, held)
    gc.collect()
    tracemalloc.start()
    try:
        base = tracemalloc.get_traced_memory()[0]
        for i in range(SUBJECTS):
            content = f"{i:05d}".encode() + bytes(SIZE)
            publisher.receive_data(encode_packet(mqtt.Publish(f"dev/d{i}", content)), 0.0)
            held.settle()
            held.settle()  # the persistent session's save
            for device in (clean, persistent):
                assert len(read(device)) == 1
        read(publisher)
        ctx.hub.expire(10.0)  # every message expired: the subjects are forgotten
        assert ctx.hub.subject_count <= 3  # the session records
        gc.collect()
        left = tracemalloc.get_traced_memory()[0] - base
    finally:
        tracemalloc.stop()
    assert left < SUBJECTS * SIZE // 10, left  # ~19.7 MB held before
    for device in (clean, persistent):
        reached = device.settle_reached()
        assert len(reached) == SUBJECTS  # below PRUNE_FROM: kept, as positions
        assert not any(isinstance(p, Message) for p in reached.values())
