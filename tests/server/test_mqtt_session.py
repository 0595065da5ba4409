"""MqttSession without I/O: bytes in, the outbox out, a publish path the test settles."""

from __future__ import annotations

from typing import Any

from migratory.config import Config
from migratory.entitlement import entitlement_from_config
from migratory.model.message import Message
from migratory.model.position import Position
from migratory.protocol import close_codes, mqtt, ops
from migratory.protocol import websocket as ws
from migratory.protocol.mqtt_encode import encode_packet
from migratory.server.app import build_hub
from migratory.server.context import LocalPublishing, PublishReply, ServerContext, ServerStatistics
from migratory.server.drain import Drain
from migratory.server.metric_figures import PublishTimings
from migratory.server.mqtt_session import MqttSession
from migratory.server.mqtt_store import decode_record, session_subject


class Wire:
    writing = False

    def mark_dirty(self) -> None:
        pass

    def flush_now(self) -> None:
        pass


class HeldPublishing:
    """Publishes wait until the test settles them (a cluster's commit)."""

    def __init__(self, hub: Any) -> None:
        self.local = LocalPublishing(hub)
        self.held: list[tuple[Message, PublishReply | None]] = []
        self.timings = PublishTimings()

    def submit(self, message: Message, reply: PublishReply | None, now: float) -> None:
        self.held.append((message, reply))

    def settle(self) -> None:
        held, self.held = self.held, []
        for message, reply in held:
            self.local.submit(message, reply, 0.0)

    def statistics(self) -> dict[str, Any]:
        return {}


def make(**settings: str) -> tuple[ServerContext, HeldPublishing]:
    config = Config.from_mapping(settings)
    hub = build_hub(config)
    held = HeldPublishing(hub)
    ctx = ServerContext(config, hub, entitlement_from_config(config), ServerStatistics(), held)
    return ctx, held


def session(ctx: ServerContext, client_id: str, registry: dict, **connect: Any) -> MqttSession:
    s = MqttSession(ctx, Wire(), "127.0.0.1:1", registry)
    s.receive_data(encode_packet(mqtt.Connect(client_id, **connect)), 0.0)
    return s


def read(s: MqttSession) -> list[mqtt.Packet]:
    data = s.outbox.take() if s.outbox else b""
    return mqtt.MqttDecoder(server=False).events(data)


def test_puback_only_once_the_publish_path_says_published() -> None:
    ctx, held = make()
    registry: dict = {}
    publisher = session(ctx, "pub", registry)
    assert read(publisher) == [mqtt.Connack(False, 0)]
    publisher.receive_data(encode_packet(mqtt.Publish("a/b", b"x", qos=1, packet_id=9)), 0.0)
    assert read(publisher) == []  # held: not committed yet
    held.settle()
    assert read(publisher) == [mqtt.Puback(9)]


def test_a_failed_publish_closes_the_connection_without_puback() -> None:
    ctx, _ = make()
    s = session(ctx, "pub", {})
    read(s)
    s.publish_result(ops.PublishStatus(ops.Status.PUBLISH_FAILED, "3", "/a/b", None, "lost"))
    assert s.closing and read(s) == []
    assert ctx.stats.publishes_refused == 1


def test_persistent_suback_waits_for_the_saved_record_and_resume_replays() -> None:
    ctx, held = make()
    registry: dict = {}
    device = session(ctx, "dev", registry, clean_session=False)
    assert read(device) == [mqtt.Connack(False, 0)]
    device.receive_data(encode_packet(mqtt.Subscribe(1, (("a/+", 1),))), 0.0)
    assert read(device) == []  # the SUBACK waits for the record
    held.settle()
    assert read(device) == [mqtt.Suback(1, (1,))]
    publisher = session(ctx, "pub", registry)
    for i in range(3):
        publisher.receive_data(
            encode_packet(mqtt.Publish("a/b", b"%d" % i, qos=1, packet_id=i + 1)), 0.0
        )
    held.settle()
    delivered = [p for p in read(device) if isinstance(p, mqtt.Publish)]
    assert [p.payload for p in delivered] == [b"0", b"1", b"2"]
    device.receive_data(encode_packet(mqtt.Puback(delivered[0].packet_id or 0)), 0.0)
    device.connection_lost()  # gone without DISCONNECT; its last position is saved
    held.settle()
    held.settle()
    back = session(ctx, "dev", registry, clean_session=False)
    packets = read(back)
    assert packets[0] == mqtt.Connack(True, 0)
    assert [p.payload for p in packets[1:] if isinstance(p, mqtt.Publish)] == [b"1", b"2"]
    assert ctx.stats.resumes == {"sync": 1}  # migratory_resumes_total, as native resumes


def test_second_connect_with_the_same_id_takes_over() -> None:
    ctx, _ = make()
    registry: dict = {}
    first = session(ctx, "same", registry)
    second = session(ctx, "same", registry)
    assert first.closing and not second.closing
    assert registry["same"] is second


def test_will_is_published_on_failure_not_when_the_server_moves_the_client() -> None:
    ctx, held = make()
    will = mqtt.Will("dev/status", b"offline", 1, True)
    moved = session(ctx, "moved", {}, will=will)
    moved.close(close_codes.DRAINED.code, "draining")
    assert held.held == []
    failed = session(ctx, "failed", {}, will=will)
    failed.receive_data(b"\xc1\x00", 0.0)  # PINGREQ with reserved flags: malformed
    assert failed.closing
    ((message, reply),) = held.held
    assert (message.subject, message.content, message.retained) == (
        "/dev/status", b"offline", True,
    )
    assert reply is None and ctx.stats.mqtt_wills_published == 1


def test_filters_per_session_are_bounded() -> None:
    from migratory.server.mqtt_subscriptions import MAX_FILTERS, MAX_WILDCARD_FILTERS

    ctx, _ = make()
    s = session(ctx, "greedy", {})
    read(s)
    wild = tuple((f"w{i}/+", 0) for i in range(MAX_WILDCARD_FILTERS + 1))
    s.receive_data(encode_packet(mqtt.Subscribe(1, wild)), 0.0)
    (suback,) = read(s)
    assert isinstance(suback, mqtt.Suback)
    assert suback.return_codes == (0,) * MAX_WILDCARD_FILTERS + (mqtt.SUBACK_FAILURE,)
    exact = tuple((f"e/{i}", 0) for i in range(MAX_FILTERS))
    s.receive_data(encode_packet(mqtt.Subscribe(2, exact)), 0.0)
    (suback,) = read(s)
    assert isinstance(suback, mqtt.Suback)
    allowed = MAX_FILTERS - MAX_WILDCARD_FILTERS
    assert suback.return_codes == (0,) * allowed + (mqtt.SUBACK_FAILURE,) * (MAX_FILTERS - allowed)
    assert ctx.hub.statistics().subscriptions == MAX_FILTERS


def test_resume_of_a_wildcard_starts_where_the_session_stood_on_older_subjects() -> None:
    ctx, held = make()
    registry: dict = {}
    publisher = session(ctx, "pub", registry)

    def publish(payload: bytes) -> None:
        publisher.receive_data(encode_packet(mqtt.Publish("a/x", payload, qos=0)), 0.0)
        held.settle()

    for old in (b"old1", b"old2", b"old3"):
        publish(old)  # before the subscription: never owed to the session
    device = session(ctx, "dev", registry, clean_session=False)
    device.receive_data(encode_packet(mqtt.Subscribe(1, (("a/+", 1),))), 0.0)
    held.settle()
    read(device)
    device.connection_lost()
    held.settle()
    publish(b"new1")
    publish(b"new2")
    back = session(ctx, "dev", registry, clean_session=False)
    packets = read(back)
    assert packets[0] == mqtt.Connack(True, 0)
    assert [p.payload for p in packets[1:] if isinstance(p, mqtt.Publish)] == [b"new1", b"new2"]


def test_an_unacknowledged_qos1_message_is_not_skipped_by_a_later_qos0_one() -> None:
    ctx, held = make()
    registry: dict = {}
    device = session(ctx, "dev", registry, clean_session=False)
    device.receive_data(encode_packet(mqtt.Subscribe(1, (("a/b", 1),))), 0.0)
    held.settle()
    read(device)
    publisher = session(ctx, "pub", registry)
    publisher.receive_data(encode_packet(mqtt.Publish("a/b", b"q1", qos=1, packet_id=1)), 0.0)
    publisher.receive_data(encode_packet(mqtt.Publish("a/b", b"q0", qos=0)), 0.0)
    held.settle()
    sent = [p for p in read(device) if isinstance(p, mqtt.Publish)]
    assert [(p.payload, p.qos) for p in sent] == [(b"q1", 1), (b"q0", 0)]
    device.connection_lost()  # q1 never acknowledged
    held.settle()
    held.settle()
    back = session(ctx, "dev", registry, clean_session=False)
    replayed = [p.payload for p in read(back) if isinstance(p, mqtt.Publish)]
    assert replayed == [b"q1", b"q0"]


def test_inflight_packet_ids_skip_outstanding_ones_and_wrap() -> None:
    from migratory.model.position import Position
    from migratory.server.mqtt_inflight import Inflight

    inflight = Inflight()
    first = inflight.add("/a/b", Position(1, 1))
    second = inflight.add("/a/b", Position(1, 2))
    assert (first, second) == (1, 2) and inflight.outstanding("/a/b")
    assert inflight.acknowledge(first) == ("/a/b", Position(1, 1))
    assert inflight.outstanding("/a/b") and inflight.acknowledge(first) is None
    assert inflight.acknowledge(second) == ("/a/b", Position(1, 2))
    assert not inflight.outstanding("/a/b") and len(inflight) == 0
    inflight._next = 65534
    assert [inflight.add("/x/y", Position(1, n)) for n in range(3)] == [65535, 1, 2]


def test_inflight_puback_out_of_order_moves_the_position_once_the_earlier_come() -> None:
    """A PUBACK before an earlier delivery's of the subject gives no position yet, and its
    identifier is not handed out again until then (mqtt_inflight.py)."""
    from migratory.model.position import Position
    from migratory.server.mqtt_inflight import Inflight

    inflight = Inflight()
    ids = [inflight.add("/a/b", Position(1, n)) for n in (1, 2, 3)]
    other = inflight.add("/c/d", Position(1, 1))
    assert inflight.acknowledge(ids[2]) == ("/a/b", None)
    assert inflight.acknowledge(ids[2]) is None  # twice: nothing more
    assert inflight.acknowledge(ids[1]) == ("/a/b", None)
    assert inflight.add("/x/y", Position(1, 1)) not in ids  # still taken
    assert inflight.acknowledge(other) == ("/c/d", Position(1, 1))
    assert inflight.acknowledge(ids[0]) == ("/a/b", Position(1, 3))  # 1..3 acknowledged
    assert not inflight.outstanding("/a/b") and len(inflight) == 1


def test_a_connection_taken_over_elsewhere_does_not_overwrite_its_successor() -> None:
    """Two registries on one hub stand for two members: the client reconnected to the
    second while the first still holds a half-open connection of it."""
    ctx, held = make()
    stale = session(ctx, "dev", {}, clean_session=False)
    stale.receive_data(encode_packet(mqtt.Subscribe(1, (("a/+", 1), ("b/+", 1)))), 0.0)
    held.settle()
    fresh = session(ctx, "dev", {}, clean_session=False)  # the other member
    assert read(fresh)[0] == mqtt.Connack(True, 0)
    held.settle()
    fresh.receive_data(encode_packet(mqtt.Unsubscribe(2, ("b/+",))), 0.0)
    held.settle()
    stale.receive_data(encode_packet(mqtt.Unsubscribe(3, ("a/+",))), 0.0)  # stale view
    stale.connection_lost()
    held.settle()
    held.settle()
    record = decode_record(ctx.hub.snapshot(session_subject("dev")))
    assert record is not None and record.filters == {"a/+": 1}
    assert record.generation == 2


def test_fan_out_queues_one_shared_publish_and_sessions_keep_no_instance_dict() -> None:
    """The fan-out path (``deliver_message``) queues the same QoS 0 PUBLISH bytes object in
    every session, and a session is a slotted object (no ``__dict__`` to look through for
    each delivery, benchmarks/mqtt_fanout_cpu.py)."""
    ctx, _held = make()
    registry: dict[str, MqttSession] = {}
    sessions = [session(ctx, f"c{i}", registry) for i in range(3)]
    for s in sessions:
        s.receive_data(encode_packet(mqtt.Subscribe(1, (("a/b", 0),))), 0.0)
        s.outbox.take()
    ctx.hub.publish(Message("/a/b", b"payload"), 0.0)
    frames = [s.outbox.take() for s in sessions]
    assert all(frame is frames[0] for frame in frames)
    assert read(sessions[0]) == [] and frames[0].endswith(b"a/bpayload")
    assert not hasattr(sessions[0], "__dict__")


def test_a_message_offered_twice_is_delivered_once_whichever_subject_came_last() -> None:
    """The fan-out keeps the last delivery's subject apart from the session's dictionary
    of positions; a message offered again (a recovery overlap, a catch-up) is still
    recognised as delivered, on that subject and on the one before it, and the positions
    a persistent session saves are the last delivered. (A refactor's guard: passes
    before and after it; fails if the subject kept apart is not written back.)"""
    ctx, held = make()
    registry: dict[str, MqttSession] = {}
    device = session(ctx, "dev", registry, clean_session=False)
    device.receive_data(encode_packet(mqtt.Subscribe(1, (("a/+", 0),))), 0.0)
    held.settle()
    read(device)
    messages = {}
    for subject in ("/a/x", "/a/y", "/a/x", "/a/y"):
        messages[subject] = ctx.hub.publish(Message(subject, subject.encode()), 0.0)
    assert len([p for p in read(device) if isinstance(p, mqtt.Publish)]) == 4
    for message in (messages["/a/x"], messages["/a/y"], messages["/a/x"]):
        device.deliver_message(message, 0)  # already delivered: dropped
    assert read(device) == []
    device.connection_lost()
    held.settle()
    held.settle()
    record = decode_record(ctx.hub.snapshot(session_subject("dev")))
    assert record is not None
    assert {s: p.seq for s, p in record.positions.items()} == {"/a/x": 2, "/a/y": 2}


def test_a_clean_takeover_discards_a_session_whose_save_is_still_in_flight() -> None:
    """The same client id connects again, clean session 1, while its persistent
    connection's record is still being saved (a cluster's commit): the session is gone
    once everything settles, not brought back by the save that lands late."""
    ctx, held = make()
    registry: dict = {}
    device = session(ctx, "dev", registry, clean_session=False)
    device.receive_data(encode_packet(mqtt.Subscribe(1, (("a/+", 1),))), 0.0)  # saving
    clean = session(ctx, "dev", registry, clean_session=True)
    assert device.closing and read(clean) == []  # the CONNACK waits for the discard
    for _ in range(3):
        held.settle()
    assert read(clean) == [mqtt.Connack(False, 0)]
    assert decode_record(ctx.hub.snapshot(session_subject("dev"))) is None
    clean.close(close_codes.NORMAL.code, "")
    held.settle()
    again = session(ctx, "dev", registry, clean_session=False)
    assert read(again) == [mqtt.Connack(False, 0)]


def test_a_clean_connect_over_a_stored_session_is_answered_once_the_discard_is_stored() -> None:
    """Answered at once, a CONNECT with clean session 0 right after it (through the
    Workers' shared port onto another worker, or onto another member) could still find
    the session the clean CONNECT discarded, filters and all: the CONNACK -- and the
    packets the client sent after the CONNECT -- wait until the empty record is stored."""
    ctx, held = make()
    registry: dict = {}
    device = session(ctx, "dev", registry, clean_session=False)
    device.receive_data(encode_packet(mqtt.Subscribe(1, (("a/+", 1),))), 0.0)
    held.settle()
    device.connection_lost()
    held.settle()
    clean = MqttSession(ctx, Wire(), "127.0.0.1:2", registry)
    more = clean.receive_data(b"".join(encode_packet(p) for p in (
        mqtt.Connect("dev", clean_session=True), mqtt.Subscribe(2, (("b/+", 0),)),
        mqtt.Pingreq())), 0.0)
    assert more and clean.decision_pending is not None  # the connection waits for it
    assert read(clean) == []  # nothing before the CONNACK, not even the SUBACK
    assert decode_record(ctx.hub.snapshot(session_subject("dev"))) is not None
    held.settle()
    assert decode_record(ctx.hub.snapshot(session_subject("dev"))) is None
    assert clean.decision_pending.future.done()
    clean.decision_pending = None  # (as the connection does once it is done)
    assert not clean.process(0.0)
    assert read(clean) == [mqtt.Connack(False, 0), mqtt.Suback(2, (0,)), mqtt.Pingresp()]


def test_a_persistent_takeover_resumes_the_live_session_not_the_older_snapshot() -> None:
    """Taken over on the same member while its record's save is in flight, the session
    goes on from the live record (session present, its filter), one generation later,
    and the older connection saves nothing after it."""
    ctx, held = make()
    registry: dict = {}
    device = session(ctx, "dev", registry, clean_session=False)
    device.receive_data(encode_packet(mqtt.Subscribe(1, (("a/+", 1),))), 0.0)  # saving
    back = session(ctx, "dev", registry, clean_session=False)
    assert read(back) == [mqtt.Connack(True, 0)]
    for _ in range(3):
        held.settle()
    record = decode_record(ctx.hub.snapshot(session_subject("dev")))
    assert record is not None and record.filters == {"a/+": 1} and record.generation == 2


def test_a_draining_member_still_saves_persistent_sessions_and_sends_them_away_without_will() -> (
    None
):
    """While the member drains (or moves clients), client publishes are refused; the
    session records the server saves for itself are not: a persistent session that gets
    a message meanwhile is not closed as 'session not saved' with its will published, and
    the positions it reached when it is sent away are saved."""
    config = Config.from_mapping({})
    hub = build_hub(config)
    held = HeldPublishing(hub)
    drain = Drain(5)
    ctx = ServerContext(config, hub, entitlement_from_config(config), ServerStatistics(),
                        drain.publishing(held))
    registry: dict = {}
    will = mqtt.Will("dev/status", b"offline", 0, False)
    device = session(ctx, "dev", registry, clean_session=False, will=will)
    device.receive_data(encode_packet(mqtt.Subscribe(1, (("a/b", 0),))), 0.0)
    held.settle()
    publisher = session(ctx, "pub", registry)
    publisher.receive_data(encode_packet(mqtt.Publish("a/b", b"0", qos=0)), 0.0)
    held.settle()  # delivered; the device's save of its position is in flight
    drain.draining = True
    publisher.receive_data(encode_packet(mqtt.Publish("a/b", b"1", qos=0)), 0.0)
    held.settle()
    held.settle()
    assert not device.closing
    device.close(close_codes.DRAINED.code, "draining")  # what the drain does next
    held.settle()
    held.settle()
    record = decode_record(hub.snapshot(session_subject("dev")))
    assert record is not None and record.positions["/a/b"].seq == 2
    assert hub.snapshot("/dev/status") is None and ctx.stats.mqtt_wills_published == 0


def test_a_publish_refused_because_the_member_drains_does_not_cost_the_client_its_will() -> (
    None
):
    """Draining, with a QoS 1 publish of the device still waiting for its commit: the
    next one is refused (not published, no PUBACK: the device publishes it again
    elsewhere), the connection is not closed as a refused publish (its will published),
    the first one still gets its PUBACK, and the drain then sends the device away."""
    config = Config.from_mapping({})
    hub = build_hub(config)
    held = HeldPublishing(hub)
    drain = Drain(5)
    ctx = ServerContext(config, hub, entitlement_from_config(config), ServerStatistics(),
                        drain.publishing(held))
    will = mqtt.Will("dev/status", b"offline", 0, False)
    device = session(ctx, "dev", {}, will=will)
    read(device)
    device.receive_data(encode_packet(mqtt.Publish("a/b", b"1", qos=1, packet_id=1)), 0.0)
    drain.draining = True
    device.receive_data(encode_packet(mqtt.Publish("a/b", b"2", qos=1, packet_id=2)), 0.0)
    assert not device.closing
    held.settle()
    assert read(device) == [mqtt.Puback(1)]
    assert drain.unsettled(device) == 0
    device.close(close_codes.DRAINED.code, "draining")  # what the drain does next
    assert hub.snapshot("/dev/status") is None and ctx.stats.mqtt_wills_published == 0
    assert [m.content for m in hub.missed("/a/b", Position(hub.position("/a/b").epoch, 0))
            ] == [b"1"]


def test_a_publish_then_garbage_gets_its_puback_before_the_connection_closes() -> None:
    """A QoS 1 PUBLISH whose outcome comes later (a cluster's commit), then a malformed
    packet in the same read: the connection closes only once the PUBACK is queued,
    exactly once (before: closed at once, the message published without a PUBACK)."""
    ctx, held = make()
    s = session(ctx, "garbler", {})
    read(s)  # CONNACK
    s.receive_data(encode_packet(mqtt.Publish("a/b", b"x", qos=1, packet_id=9)) + b"\xf0\x00",
                   0.0)
    assert s.closing and read(s) == []
    held.settle()
    assert read(s) == [mqtt.Puback(9)]
    assert not s.settling


def test_over_websocket_the_close_frame_follows_the_puback() -> None:
    """MQTT over WebSocket, a QoS 1 PUBLISH then a malformed packet (reserved type 15)
    in one read: the close frame waits for the PUBACK and follows it. (Garbage at the
    WebSocket layer -- a text frame -- closes before the PUBLISH is handled: not
    published, no PUBACK, which MQTT 3.1.1 reads as not acknowledged.)"""
    ctx, held = make()
    s = MqttSession(ctx, Wire(), "127.0.0.1:1", {}, websocket=True)
    publish = encode_packet(mqtt.Publish("a/b", b"x", qos=1, packet_id=4))
    s.receive_data(ws.encode_masked_binary(encode_packet(mqtt.Connect("w")), b"mask"), 0.0)
    s.outbox.take()  # CONNACK
    s.receive_data(ws.encode_masked_binary(publish + b"\xf0\x00", b"mask"), 0.0)
    assert s.closing and not s.outbox
    held.settle()
    events = ws.FrameDecoder(client_frames=False).events(s.outbox.take())
    assert isinstance(events[0], ws.BinaryMessage)
    assert mqtt.MqttDecoder(server=False).events(events[0].data) == [mqtt.Puback(4)]
    assert isinstance(events[1], ws.CloseReceived) and len(events) == 2
