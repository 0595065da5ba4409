"""MqttSession without I/O: the work a client can make the server do, bound then work --
wildcard scans, persistent records saved, replies and pongs not read, WebSocket
fragments (helpers from test_mqtt_session)."""

from __future__ import annotations

import gc
from typing import Any

import pytest
from test_mqtt_delivery import wildcard_sessions
from test_mqtt_session import Wire, make, read, session

from migratory.config import Config
from migratory.entitlement import entitlement_from_config
from migratory.model.message import Message
from migratory.model.position import Position
from migratory.protocol import close_codes, mqtt
from migratory.protocol import websocket as ws
from migratory.protocol.mqtt_encode import encode_packet
from migratory.server import mqtt_saving
from migratory.server.app import build_hub
from migratory.server.context import LocalPublishing, ServerContext, ServerStatistics
from migratory.server.hub import Hub
from migratory.server.mqtt_delivery import PRUNE_FROM, MqttDelivery
from migratory.server.mqtt_inflight import ENTRY_BYTES
from migratory.server.mqtt_input import SCAN_UNIT
from migratory.server.mqtt_session import MqttSession
from migratory.server.mqtt_store import decode_record, session_subject
from migratory.server.mqtt_subscriptions import SCAN_SLICE, Subscriptions


def count_subject_passes(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """Counts the hub's scans of the subjects wildcard filters match (``matching_any``):
    the work these tests bound, counted rather than timed."""
    passes = [0]
    for name in ("matching_any",):
        original = getattr(Hub, name)

        def counted(self: Hub, *args: Any, _original: Any = original, **kw: Any) -> Any:
            passes[0] += 1
            return _original(self, *args, **kw)

        monkeypatch.setattr(Hub, name, counted)
    return passes


class CountingFilters(dict):  # type: ignore[type-arg]
    """A session's filters that count the looks at all of them."""

    looks = 0

    def values(self) -> Any:
        CountingFilters.looks += 1
        return super().values()

    def items(self) -> Any:
        CountingFilters.looks += 1
        return super().items()


def test_wildcard_subscribes_scan_the_subjects_once_and_count_in_the_turn(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A SUBSCRIBE of 100 wildcard filters matching nothing, on a server of 20,000
    retained subjects: one scan for all of them (each filter scanning them cost 2.4 s of
    a stopped server at 50,000), and a flood of such SUBSCRIBEs waits for the others'
    turn: a turn scans one slice (SCAN_SLICE visits) at most."""
    ctx, held = make(MaxPublishesPerSecond="0")
    publisher = session(ctx, "pub", {})
    publisher.receive_data(b"".join(
        encode_packet(mqtt.Publish(f"s{i % 100}/n{i}", b"x", retain=True))
        for i in range(20_000)), 0.0)
    held.settle()
    assert ctx.hub.subject_count == 20_000
    device = session(ctx, "dev", {})
    read(device)
    filters = tuple((f"+/nothing{k}/#", 0) for k in range(100))
    passes = count_subject_passes(monkeypatch)
    device.receive_data(encode_packet(mqtt.Subscribe(1, filters)), 0.0)
    assert read(device) == [mqtt.Suback(1, (0,) * 100)]
    assert passes[0] == 1  # not one per filter (100 passes took > 1 s here)
    flood = b"".join(encode_packet(mqtt.Subscribe(n, filters)) for n in range(2, 66))
    visited = ctx.hub.subjects_visited
    more = device.receive_data(flood, 0.0, budget=64)
    turns = [ctx.hub.subjects_visited - visited]
    while more and len(turns) < 1000:
        visited = ctx.hub.subjects_visited
        more = device.process(0.0, 64)
        turns.append(ctx.hub.subjects_visited - visited)
    assert len(read(device)) == 64
    # a SUBSCRIBE's scan: the root, 100 first levels, 100 names looked up in each
    assert sum(turns) == 64 * (1 + 100 + 100 * 100)
    assert max(turns) <= SCAN_SLICE + 101  # a slice ends after a level's lookups


def test_a_persistent_wildcard_session_does_not_rescan_the_subjects_at_each_save(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Each message delivered to a persistent session saves its record; a one-off
    subject's message made that save scan every subject again for the record's implied
    positions (16 ms per publish at 20,000 subjects). The scan is for a change of the
    filters; what a new subject brings is delivered, its position recorded."""
    ctx, held = make(MaxPublishesPerSecond="0")
    publisher = session(ctx, "pub", {})
    publisher.receive_data(b"".join(
        encode_packet(mqtt.Publish(f"s{i % 100}/n{i}", b"x")) for i in range(20_000)), 0.0)
    held.settle()
    device = session(ctx, "dev", {}, clean_session=False)
    device.receive_data(encode_packet(mqtt.Subscribe(1, (("new/+", 0),))), 0.0)
    held.settle()
    read(device)
    passes = count_subject_passes(monkeypatch)
    for i in range(50):
        publisher.receive_data(encode_packet(mqtt.Publish(f"new/n{i}", b"%d" % i)), 0.0)
        held.settle()
        held.settle()
    assert len(read(device)) == 50
    assert passes[0] == 0  # 50 scans of 20,000 subjects took ~0.8 s here
    device.connection_lost()
    held.settle()
    record = decode_record(ctx.hub.snapshot(session_subject("dev")))
    assert record is not None and record.positions["/new/n49"].seq == 1


def test_positions_alone_are_saved_at_most_once_per_save_interval(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A persistent '+/+' session on 20,000 subjects has 10,000 positions in its record:
    saved whole at every delivery, 50 deliveries cost ~0.8 s of CPU (saves now carry only
    the positions that changed, but each is still a Raft entry). Positions alone are saved
    once per SAVE_INTERVAL (the next delivery after it), filters at once, and the
    connection's end saves where it stood."""
    now = [100.0]
    monkeypatch.setattr(mqtt_saving, "clock", lambda: now[0])
    ctx, held = make(MaxPublishesPerSecond="0")
    publisher = session(ctx, "pub", {})
    publisher.receive_data(b"".join(
        encode_packet(mqtt.Publish(f"s{i % 100}/n{i}", b"x")) for i in range(20_000)), 0.0)
    held.settle()
    device = session(ctx, "dev", {}, clean_session=False)
    device.receive_data(encode_packet(mqtt.Subscribe(1, (("+/+", 0),))), 0.0)
    held.settle()
    assert read(device)[-1] == mqtt.Suback(1, (0,))  # filters: saved at once
    for i in range(50):
        publisher.receive_data(encode_packet(mqtt.Publish("new/a", b"%d" % i)), 0.0)
        held.settle()
    assert len(read(device)) == 50

    def saved() -> Position | None:
        record = decode_record(ctx.hub.snapshot(session_subject("dev")))
        assert record is not None
        return record.positions.get("/new/a")

    assert saved() is None  # within SAVE_INTERVAL of the SUBACK's save
    now[0] += mqtt_saving.SAVE_INTERVAL
    publisher.receive_data(encode_packet(mqtt.Publish("new/a", b"50")), 0.0)
    held.settle()  # the publish, then the save it caused
    held.settle()
    assert saved() == ctx.hub.position("/new/a")  # the first delivery after it saves
    publisher.receive_data(encode_packet(mqtt.Publish("new/a", b"51")), 0.0)
    held.settle()
    held.settle()
    assert saved() != ctx.hub.position("/new/a")
    device.connection_lost()
    held.settle()
    assert saved() == ctx.hub.position("/new/a")  # the end saves where it stood


def test_a_session_of_many_filters_and_positions_resumes_without_looking_at_each_filter(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Which filters match a subject is a lookup (exact filters) and a tree walk
    (wildcards), not a look at every filter: resuming a session of 1,000 filters and
    5,000 positions, and each change of its filters, looked at every filter for every
    position (0.6 s of CPU per CONNECT here, 0.3 s per UNSUBSCRIBE)."""
    ctx, held = make(MaxPublishesPerSecond="0")
    publisher = session(ctx, "pub", {})
    publisher.receive_data(b"".join(
        encode_packet(mqtt.Publish(f"s{i % 100}/n{i}", b"x")) for i in range(5_000)), 0.0)
    held.settle()
    registry: dict = {}
    device = session(ctx, "dev", registry, clean_session=False)
    filters = tuple((f"e{k}/x", 0) for k in range(900)) + tuple(
        (f"s{k}/+", 0) for k in range(100))
    device.receive_data(encode_packet(mqtt.Subscribe(1, filters)), 0.0)
    held.settle()
    assert read(device)[-1] == mqtt.Suback(1, (0,) * 1000)
    device.subscriptions._filters = CountingFilters(device.subscriptions._filters)
    CountingFilters.looks = 0
    device.receive_data(encode_packet(mqtt.Unsubscribe(2, ("e0/x",))), 0.0)
    held.settle()
    assert CountingFilters.looks <= 1, CountingFilters.looks  # not one per position
    device.connection_lost()
    held.settle()
    held.settle()
    init = Subscriptions.__init__

    def counting(self: Subscriptions, *args: Any, **kw: Any) -> None:
        init(self, *args, **kw)
        self._filters = CountingFilters()

    monkeypatch.setattr(Subscriptions, "__init__", counting)
    CountingFilters.looks = 0
    back = session(ctx, "dev", registry, clean_session=False)
    assert read(back)[0] == mqtt.Connack(True, 0)
    # not one per position: the save at the take-up, the session taking its filters back
    # from the catch-up (mqtt_resume), the save after it
    assert CountingFilters.looks <= 3, CountingFilters.looks


def test_a_flood_of_filter_changes_of_a_persistent_session_waits_for_the_others_turn() -> None:
    """Each change of a persistent session's filters looks at its recorded positions
    and, with wildcard filters, at every subject they match (implied_positions: here
    all of them, '+/+'): that work counts
    in the packets a connection may have handled per loop turn (SCAN_UNIT), so 64
    SUBSCRIBE/UNSUBSCRIBE packets are not all handled in one turn (a single server:
    each save, and its scan, happens as the packet is handled)."""
    config = Config.from_mapping({"MaxPublishesPerSecond": "0"})
    hub = build_hub(config)
    ctx = ServerContext(config, hub, entitlement_from_config(config), ServerStatistics(),
                        LocalPublishing(hub))
    publisher = session(ctx, "pub", {})
    publisher.receive_data(b"".join(
        encode_packet(mqtt.Publish(f"s{i % 100}/n{i}", b"x")) for i in range(5_000)), 0.0)
    device = session(ctx, "dev", {}, clean_session=False)
    device.receive_data(encode_packet(mqtt.Subscribe(1, (("+/+", 0), ("s2/+", 0)))), 0.0)
    read(device)
    flood = b"".join(
        encode_packet(mqtt.Subscribe(n, (("x/y", 0),)) if n % 2
                      else mqtt.Unsubscribe(n, ("x/y",))) for n in range(2, 66))
    assert device.receive_data(flood, 0.0, budget=64)  # more waits for a later turn
    # each save: its 5,000 recorded positions and the 5,101 visits of '+/+' (the root,
    # 100 levels, 5,000 subjects)
    assert len(read(device)) == 64 // (1 + (5_000 + 5_101) // SCAN_UNIT) + 1


def test_mqtt_over_websocket_honours_max_fragments_per_message() -> None:
    """MaxFragmentsPerMessage bounds the frames one WebSocket message may be split into
    for MQTT over WebSocket as for the native protocol (it kept the decoder's default,
    1,024, whatever the key said)."""
    ctx, _ = make(MaxFragmentsPerMessage="4")
    mask = b"mask"
    packet = encode_packet(mqtt.Connect("frag"))
    pieces = [packet[i:i + 1] for i in range(5)] + [packet[5:]]
    frames = [ws.encode_frame(ws.BINARY, pieces[0], fin=False, mask=mask)] + [
        ws.encode_frame(ws.CONTINUATION, p, fin=n == len(pieces) - 1, mask=mask)
        for n, p in enumerate(pieces[1:], 1)]
    device = MqttSession(ctx, Wire(), "127.0.0.1:1", {}, websocket=True)
    device.receive_data(b"".join(frames), 0.0)
    assert device.closing and device.identity is None
    assert ctx.stats.mqtt_protocol_errors == 1


def test_replies_a_client_does_not_read_are_bounded_by_client_max_pending_bytes() -> None:
    """PINGREQ (or QoS 1 PUBLISH, SUBSCRIBE...) sent without reading the replies: they
    count against ClientMaxPendingBytes like deliveries, and the client is cut off as a
    slow consumer, instead of the replies piling up without bound."""
    ctx, _ = make(ClientMaxPendingBytes="4096", MaxMessageSize="2048")
    device = session(ctx, "flood", {})
    device.receive_data(b"\xc0\x00" * 10_000, 0.0)  # 10,000 PINGREQ, nothing read
    assert device.closing and device.close_code == close_codes.SLOW_CONSUMER.code
    assert device.outbox.pending_bytes <= 4096
    assert ctx.stats.slow_consumers == 1


def test_websocket_pings_of_an_mqtt_client_that_does_not_read_are_bounded() -> None:
    """Over WebSocket, the pongs answering a client's pings count against
    ClientMaxPendingBytes like MQTT replies (they were queued without bound)."""
    ctx, _ = make(ClientMaxPendingBytes="4096", MaxMessageSize="2048")
    device = MqttSession(ctx, Wire(), "127.0.0.1:1", {}, websocket=True)
    ping = ws.encode_frame(ws.PING, b"p" * 100, mask=b"mask")
    device.receive_data(ws.encode_masked_binary(encode_packet(mqtt.Connect("ws")), b"mask"),
                        0.0)
    device.receive_data(ping * 1_000, 0.0)  # pings alone, no MQTT packet
    assert device.closing and device.close_code == close_codes.SLOW_CONSUMER.code
    assert device.outbox.pending_bytes <= 4096 + 200  # and its close frame


def test_a_resume_cut_off_as_a_slow_consumer_stops_replaying(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A persistent session that missed more than ClientMaxPendingBytes is cut off while
    it is replayed; the replay went on offering every remaining missed message to the
    closed session (273 ms of CPU for 100 subjects x 1,000 missed 1 kB messages, per
    CONNECT). It stops at the cut; the client resumes from its saved positions."""
    ctx, held = make(MaxPublishesPerSecond="0", ClientMaxPendingBytes="65536",
                     MaxMessageSize="32768")
    registry: dict = {}
    device = session(ctx, "dev", registry, clean_session=False)
    device.receive_data(encode_packet(mqtt.Subscribe(1, tuple(
        (f"r/s{k}", 0) for k in range(100)))), 0.0)
    held.settle()
    device.connection_lost()
    held.settle()
    publisher = session(ctx, "pub", {})
    publisher.receive_data(b"".join(
        encode_packet(mqtt.Publish(f"r/s{k}", b"y" * 1000)) for k in range(100)
        for _ in range(200)), 0.0)
    held.settle()
    offered = []
    deliver = MqttDelivery.deliver_message

    def counting(self: MqttDelivery, message: Message, qos: int) -> None:
        offered.append(message)
        deliver(self, message, qos)

    monkeypatch.setattr(MqttDelivery, "deliver_message", counting)
    back = session(ctx, "dev", registry, clean_session=False)
    assert back.closing and back.close_code == close_codes.SLOW_CONSUMER.code
    assert len(offered) < 200  # ~64 kB of them, not the 20,000 missed


def test_the_retained_messages_of_a_subscribe_to_everything_go_out_a_slice_per_turn() -> None:
    """'#' on a server of 20,000 retained subjects: the retained messages go out at most
    a slice (SCAN_SLICE visits) per turn of the loop, the other clients' turn between
    two (all of them in one turn stopped the server 200 ms at 50,000 subjects); the
    SUBACK follows the last one; a subject published meanwhile gets its live message,
    not its older retained one after it."""
    ctx, held = make(MaxPublishesPerSecond="0", ClientMaxPendingBytes="100000000")
    publisher = session(ctx, "pub", {})
    publisher.receive_data(b"".join(
        encode_packet(mqtt.Publish(f"s{i % 100}/n{i}", b"old", retain=True))
        for i in range(20_000)), 0.0)
    held.settle()
    device = session(ctx, "dev", {})
    read(device)
    more = device.receive_data(encode_packet(mqtt.Subscribe(1, (("#", 0),))), 0.0, budget=64)
    per_turn = [read(device)]
    publisher.receive_data(encode_packet(mqtt.Publish("s99/n19999", b"new")), 0.0)
    held.settle()  # the last subject the scan reaches, published live meanwhile
    while more and len(per_turn) < 1000:
        more = device.process(0.0, 64)
        per_turn.append(read(device))
    assert max(len(turn) for turn in per_turn) <= SCAN_SLICE
    packets = [packet for turn in per_turn for packet in turn]
    assert packets[-1] == mqtt.Suback(1, (0,))
    last = [p for p in packets if isinstance(p, mqtt.Publish) and p.topic == "s99/n19999"]
    assert [(p.payload, p.retain) for p in last] == [(b"new", False)]
    assert len(packets) == 20_000 + 1


def test_a_resumed_wildcard_session_catches_up_a_slice_per_turn_in_order() -> None:
    """A persistent '#' session comes back to 5,000 subjects with a message it missed
    each and 1,000 subjects created meanwhile: it gets all 6,000 messages, at most a
    slice (SCAN_SLICE) per turn of the loop (all of them as its CONNECT was handled
    stopped the server 1.1 s at 50,000 subjects); a live message of a subject not
    caught up yet comes after what it missed, once."""
    ctx, held = make(MaxPublishesPerSecond="0", ClientMaxPendingBytes="100000000")
    registry: dict = {}
    publisher = session(ctx, "pub", {})
    old = [f"s{i % 100}/n{i}" for i in range(5_000)]
    publisher.receive_data(b"".join(encode_packet(mqtt.Publish(t, b"1")) for t in old), 0.0)
    held.settle()
    device = session(ctx, "dev", registry, clean_session=False)
    device.receive_data(encode_packet(mqtt.Subscribe(1, (("#", 0),))), 0.0)
    held.settle()
    device.connection_lost()
    held.settle()
    new = [f"new/n{i}" for i in range(1_000)]
    publisher.receive_data(b"".join(encode_packet(mqtt.Publish(t, b"2")) for t in old + new),
                           0.0)
    held.settle()
    back = MqttSession(ctx, Wire(), "127.0.0.1:1", registry)
    more = back.receive_data(encode_packet(mqtt.Connect("dev", clean_session=False)), 0.0,
                             budget=64)
    per_turn = [read(back)]
    assert per_turn[0][0] == mqtt.Connack(True, 0)
    publisher.receive_data(encode_packet(mqtt.Publish("new/n7", b"live")), 0.0)
    held.settle()
    while more and len(per_turn) < 1000:
        more = back.process(0.0, 64)
        held.settle()
        per_turn.append(read(back))
    assert max(len(turn) for turn in per_turn) <= SCAN_SLICE
    got = [(p.topic, p.payload) for turn in per_turn for p in turn
           if isinstance(p, mqtt.Publish)]
    assert sorted(got) == sorted([(t, b"2") for t in old + new] + [("new/n7", b"live")])
    assert [payload for topic, payload in got if topic == "new/n7"] == [b"2", b"live"]


def test_a_resume_logs_a_few_subjects_resumed_from_their_snapshot_and_counts_all(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A session resumed on 50 subjects whose caches no longer reach back: every one is
    counted (mqtt_resyncs), ten are logged one by one, then one line for the rest (a
    warning per subject was 400,000 lines for a '#' session on 500,000 subjects)."""
    ctx, held = make(MaxPublishesPerSecond="0", MaxCachedMessagesPerSubject="1")
    registry: dict = {}
    publisher = session(ctx, "pub", {})
    device = session(ctx, "dev", registry, clean_session=False)
    device.receive_data(encode_packet(mqtt.Subscribe(1, (("s/+", 0),))), 0.0)
    held.settle()
    publisher.receive_data(b"".join(
        encode_packet(mqtt.Publish(f"s/n{i}", b"1")) for i in range(50)), 0.0)
    held.settle()
    device.connection_lost()
    held.settle()
    publisher.receive_data(b"".join(
        encode_packet(mqtt.Publish(f"s/n{i}", b"%d" % k)) for k in (2, 3) for i in range(50)),
        0.0)
    held.settle()
    caplog.clear()
    with caplog.at_level("WARNING", logger="migratory.mqtt"):
        session(ctx, "dev", registry, clean_session=False)
    assert ctx.stats.mqtt_resyncs == 50
    resumed = [r for r in caplog.records if "from their snapshot" in r.getMessage()
               or "from its snapshot" in r.getMessage()]
    assert len(resumed) == 10 + 1


def test_wildcard_sessions_forget_the_subjects_the_hub_forgot() -> None:
    """Devices come and go: a '#' session over days of one-off subjects (10,000 here,
    each expired and forgotten by the hub) kept the last message and position of every
    one of them, clean or persistent (whose record, saved whole every second, grew
    with them). They are forgotten with the hub's: a session keeps at most about twice
    what the hub knows, plus PRUNE_FROM."""
    ctx, held = make(MaxPublishesPerSecond="0", CacheExpireTime="1")
    publisher, clean, persistent = wildcard_sessions(ctx, held)
    for round_ in range(10):
        publisher.receive_data(b"".join(
            encode_packet(mqtt.Publish(f"dev/d{round_}-{i}", b"x")) for i in range(1000)), 0.0)
        held.settle()
        held.settle()  # the persistent session's save
        for device in (clean, persistent):
            assert len(read(device)) == 1000
        ctx.hub.expire(10.0)  # every message expired: the subjects are forgotten
        assert ctx.hub.subject_count <= 3  # the session records
    limit = 2 * 1000 + PRUNE_FROM
    assert len(clean.settle_reached()) <= limit
    assert len(persistent.settle_reached()) <= limit
    record = persistent._record
    assert record is not None and len(record.positions) <= limit


def test_qos1_messages_a_subscriber_never_acknowledges_are_bounded_by_its_budget() -> None:
    """A QoS 1 subscriber that reads every message and never sends PUBACK: the session
    kept each one's packet identifier, subject and position until all 65,535 identifiers
    were taken -- 11.5 MB per connection, past ClientMaxPendingBytes (4 MiB) and counted
    nowhere. Each now counts ENTRY_BYTES against ClientMaxPendingBytes."""
    ctx, held = make(MaxPublishesPerSecond="0", ClientMaxPendingBytes=str(100 * ENTRY_BYTES),
                     MaxMessageSize="4096")
    publisher = session(ctx, "pub", {})
    device = session(ctx, "dev", {})
    device.receive_data(encode_packet(mqtt.Subscribe(1, (("a/b", 1),))), 0.0)
    held.settle()
    read(device)
    delivered = 0
    for n in range(1, 1001):
        publisher.receive_data(
            encode_packet(mqtt.Publish("a/b", b"x", qos=1, packet_id=n)), 0.0)
        held.settle()
        read(publisher)
        delivered += sum(isinstance(p, mqtt.Publish) for p in read(device))
        if device.closing:
            break
    assert device.closing and delivered == 100


def test_a_device_that_never_publishes_holds_no_publish_rate() -> None:
    """Most MQTT devices only subscribe: the token bucket each held (~80 bytes) is made at
    the first PUBLISH, with a whole second's burst as before (the native session's rule,
    test_admission.py)."""
    from migratory.server.admission import PublishRate

    def holds_a_rate(s: MqttSession) -> bool:
        return any(isinstance(held, PublishRate) for held in gc.get_referents(s))

    ctx, held = make(MaxPublishesPerSecond="5")
    device = session(ctx, "dev", {})
    device.receive_data(encode_packet(mqtt.Subscribe(1, (("r/s", 0),))), 500.0)
    assert not holds_a_rate(device)
    device.receive_data(b"".join(encode_packet(mqtt.Publish("r/s", b"%d" % i))
                                 for i in range(5)), 900.0)
    held.settle()
    assert holds_a_rate(device) and not device.closing
    device.receive_data(encode_packet(mqtt.Publish("r/s", b"over")), 900.0)
    assert device.closing  # the sixth within the second: past the limit, closed
