"""What an MQTT session's delivery side holds (mqtt_delivery.py): per subject delivered,
its position, never the message (whose content the hub has dropped since)."""

from __future__ import annotations

import gc
import sys
import tracemalloc
from collections import Counter
from typing import Any

from test_mqtt_session import HeldPublishing, Wire, make, read, session

from migratory.model.message import Message
from migratory.model.position import Position
from migratory.protocol import mqtt
from migratory.protocol.mqtt_encode import encode_packet
from migratory.server.context import ServerContext
from migratory.server.mqtt_delivery import DROP_SLACK
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


def publish_each(publisher: MqttSession, held: HeldPublishing, topics: list[str],
                 payload: bytes, **publish: Any) -> None:
    publisher.receive_data(b"".join(
        encode_packet(mqtt.Publish(t, payload, **publish)) for t in topics), 0.0)
    held.settle()
    read(publisher)


def held_bytes(positions: dict[str, Position | Message]) -> int:
    """What a session's positions take: the dict's table, and each Position it holds (a
    Message is the hub's, counted there; the subjects' names are the hub's too)."""
    return sys.getsizeof(positions) + sum(
        sys.getsizeof(p) for p in positions.values() if isinstance(p, Position))


def test_a_clean_wildcard_session_keeps_at_most_MqttSessionMaxSubjects_positions() -> None:
    """A clean '#' session over live subjects kept a position for every subject it was
    delivered, without bound (~88 B each: 88 MB per session over 1,000,000 subjects,
    benchmarks/mqtt_session_positions.py); only the persistent record was bounded. It
    keeps at most MqttSessionMaxSubjects now (the oldest dropped first, a sixteenth of
    the bound more at a time, counted in mqtt_positions_dropped) and still gets every
    message once, in order. Counted in entries and in bytes."""
    ctx, held = make(MaxPublishesPerSecond="0", MaxCachedMessagesPerSubject="1",
                     MqttSessionMaxSubjects="1000")
    publisher = session(ctx, "pub", {})
    clean = session(ctx, "clean", {})
    clean.receive_data(encode_packet(mqtt.Subscribe(1, (("dev/#", 0),))), 0.0)
    read(clean)
    topics = [f"dev/d{i}" for i in range(5000)]
    for payload in (b"1", b"2"):
        publish_each(publisher, held, topics, payload)
        assert [(p.topic, p.payload) for p in read(clean)] == [(t, payload) for t in topics]
    reached = clean.settle_reached()
    assert 1000 - 1000 // DROP_SLACK <= len(reached) <= 1000
    assert ctx.stats.mqtt_positions_dropped >= 2 * (5000 - 1000)
    assert held_bytes(reached) < 1000 * 200, held_bytes(reached)  # 5,000 held: 344 kB


def test_a_persistent_wildcard_session_keeps_at_most_as_many_positions_as_its_record() -> None:
    """The same for a persistent session: its record named at most MqttSessionMaxSubjects
    subjects, its memory every one (5,000 here)."""
    ctx, held = make(MaxPublishesPerSecond="0", MqttSessionMaxSubjects="1000")
    publisher, _clean, persistent = wildcard_sessions(ctx, held)
    publish_each(publisher, held, [f"dev/d{i}" for i in range(5000)], b"1")
    held.settle()  # the record's save
    assert len(read(persistent)) == 5000
    record = persistent._record
    assert record is not None and len(record.positions) == 1000
    assert 1000 - 1000 // DROP_SLACK <= len(persistent.settle_reached()) <= 1000


def test_many_sessions_each_just_under_the_bound_keep_every_position() -> None:
    """Twenty '#' sessions, each delivered one subject fewer than the bound: nothing is
    dropped (the bound is per session, and exact), every message reaches every one of
    them; one subject more and each drops the oldest, a sixteenth of the bound more
    (DROP_SLACK)."""
    ctx, held = make(MaxPublishesPerSecond="0", MqttSessionMaxSubjects="1000")
    publisher = session(ctx, "pub", {})
    devices = [session(ctx, f"d{k}", {}) for k in range(20)]
    for device in devices:
        device.receive_data(encode_packet(mqtt.Subscribe(1, (("dev/#", 0),))), 0.0)
        read(device)
    topics = [f"dev/d{i}" for i in range(999)]
    publish_each(publisher, held, topics, b"1")
    for device in devices:
        assert len(read(device)) == 999
        assert len(device.settle_reached()) == 999
    assert ctx.stats.mqtt_positions_dropped == 0
    publish_each(publisher, held, ["dev/last", "dev/after"], b"1")
    for device in devices:
        assert [p.topic for p in read(device)] == ["dev/last", "dev/after"]
        reached = device.settle_reached()
        assert 1000 - 1000 // DROP_SLACK <= len(reached) <= 1000
        assert "/dev/d0" not in reached and "/dev/after" in reached and "/dev/d998" in reached
    assert ctx.stats.mqtt_positions_dropped == 20 * (1 + 1000 // DROP_SLACK)


def test_a_resume_past_the_bound_delivers_each_missed_message_once() -> None:
    """A persistent '#' session whose record names 1,000 of 2,500 subjects resumes: the
    1,000 get what they missed (2 each), the 1,500 the record forgot their whole cache
    (3 each, docs/mqtt.md); none more: positions are not dropped while the catch-up
    goes on (a subject caught up and dropped would be caught up again, its cache twice).
    Once it is done the session holds at most the bound."""
    ctx, held = make(MaxPublishesPerSecond="0", MqttSessionMaxSubjects="1000",
                     ClientMaxPendingBytes="100000000")
    registry: dict = {}
    publisher = session(ctx, "pub", {})
    topics = [f"s{i % 50}/n{i}" for i in range(2500)]
    device = session(ctx, "dev", registry, clean_session=False)
    device.receive_data(encode_packet(mqtt.Subscribe(1, (("#", 0),))), 0.0)
    held.settle()
    publish_each(publisher, held, topics, b"1")
    held.settle()  # the record's save
    device.connection_lost()
    held.settle()
    publish_each(publisher, held, topics, b"2")
    publish_each(publisher, held, topics, b"3")
    back = MqttSession(ctx, Wire(), "127.0.0.1:1", registry)
    more = back.receive_data(encode_packet(mqtt.Connect("dev", clean_session=False)), 0.0,
                             budget=64)
    packets = read(back)
    while more and len(packets) < 100_000:
        more = back.process(0.0, 64)
        held.settle()
        packets += read(back)
    got = Counter(p.topic for p in packets if isinstance(p, mqtt.Publish))
    assert sum(got.values()) == 1000 * 2 + 1500 * 3
    assert set(got.values()) == {2, 3}
    assert len(back.settle_reached()) <= 1000


def test_a_subscribe_to_everything_holds_no_copy_of_the_positions() -> None:
    """'#' on a server of 20,000 retained subjects, sent a slice per turn: the session
    copied every position it held at the end of the first slice (to tell, later, which
    subjects had a live message meanwhile) and kept one per retained message sent --
    ~5 MB here at the peak, 0.3 GB per subscribe at 1,000,000 subjects. Now at most
    MqttSessionMaxSubjects positions, and only the subjects delivered live meanwhile are
    noted (tracemalloc's peak, the outbox taken after every turn)."""
    ctx, held = make(MaxPublishesPerSecond="0", MqttSessionMaxSubjects="1000",
                     ClientMaxPendingBytes="100000000")
    publisher = session(ctx, "pub", {})
    topics = [f"s{i % 100}/n{i}" for i in range(20_000)]
    publish_each(publisher, held, topics, b"old", retain=True)
    device = session(ctx, "dev", {})
    read(device)
    gc.collect()
    tracemalloc.start()
    try:
        base = tracemalloc.get_traced_memory()[0]
        tracemalloc.reset_peak()
        more = device.receive_data(encode_packet(mqtt.Subscribe(1, (("#", 0),))), 0.0,
                                   budget=64)
        count = len(read(device))
        publish_each(publisher, held, ["s99/n19999"], b"new")
        while more:
            more = device.process(0.0, 64)
            count += len(read(device))
        peak = tracemalloc.get_traced_memory()[1] - base
    finally:
        tracemalloc.stop()
    assert count == 20_000 + 1  # every retained message (one live instead) and the SUBACK
    assert len(device.settle_reached()) <= 1000
    assert peak < 1_000_000, peak
