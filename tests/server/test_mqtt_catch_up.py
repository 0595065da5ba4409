"""MQTT sessions whose subject a cluster cache sync moved forward while they were live
(Hub.reposition -> Hub._catch_up_live -> MqttDelivery.deliver_missed): each gets the
same packets, in the same order, as one ``deliver_message`` per message gave it
(``per_message``, the same input) -- a clean session at QoS 0 as runs of the shared
PUBLISHes, encoded once for all of them; before, every session encoded every message
again (the shared frame is the last message's) and queued them one by one. Persistent
sessions, QoS 1 and a session that has some of them already go one at a time, as
before. Bytes in, packets out; counted, never timed."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from test_mqtt_session import HeldPublishing, Wire, read

from migratory.config import Config
from migratory.entitlement import entitlement_from_config
from migratory.model.message import Message, Qos
from migratory.model.position import Position
from migratory.protocol import mqtt, mqtt_encode
from migratory.protocol import websocket as ws
from migratory.protocol.mqtt_encode import encode_packet
from migratory.server import hub as hub_module
from migratory.server.context import ServerContext, ServerStatistics
from migratory.server.format_sink import MessageSink, MissedRun
from migratory.server.hub import Hub
from migratory.server.mqtt_backlog import HELD_OVERHEAD
from migratory.server.mqtt_session import MqttSession
from migratory.server.session_subscriptions import MESSAGES_PER_UNIT, SLICE_UNITS

SUBJECT = "/a/b"
EPOCH = 5
HELD = 3
JUMP = 200


def per_message(listeners: list[tuple[MessageSink, int]], missed: MissedRun) -> None:
    """What the hub did before: each session, each message, one at a time."""
    for sink, qos in listeners:
        for message in missed.messages:
            sink.deliver_message(message, qos)


def message(seq: int, qos: Qos = Qos.STANDARD) -> Message:
    return Message(SUBJECT, b"m%d" % seq + b"." * (seq % 5 * 30), qos=qos, epoch=EPOCH,
                   seq=seq)


def member(qos: Qos, **settings: str) -> tuple[Hub, ServerContext]:
    hub = Hub(epoch=1, numbered_elsewhere=True)
    for seq in range(1, HELD + 1):
        hub.apply(message(seq, qos), 0.0)
    config = Config.from_mapping(settings)
    ctx = ServerContext(config, hub, entitlement_from_config(config), ServerStatistics(),
                        HeldPublishing(hub))
    return hub, ctx


def device(ctx: ServerContext, client_id: str, qos: int, *, clean: bool = True,
           websocket: bool = False) -> MqttSession:
    session = MqttSession(ctx, Wire(), "127.0.0.1:1", {},  # type: ignore[arg-type]
                          websocket=websocket)
    packets = [encode_packet(mqtt.Connect(client_id, clean_session=clean)),
               encode_packet(mqtt.Subscribe(1, (("a/b", qos),)))]
    session.receive_data(b"".join(ws.encode_masked_binary(p, b"mask") for p in packets)
                         if websocket else b"".join(packets), 0.0)
    ctx.publishing.settle()  # type: ignore[attr-defined]
    session.outbox.take()
    return session


def jump(hub: Hub, qos: Qos) -> None:
    hub.reposition(SUBJECT, Position(EPOCH, HELD + JUMP), None,
                   [message(seq, qos) for seq in range(1, HELD + JUMP + 1)], 0.0)


def sessions(ctx: ServerContext) -> list[MqttSession]:
    return [*(device(ctx, f"c{n}", 0) for n in range(6)),  # clean, QoS 0
            *(device(ctx, f"q{n}", 1) for n in range(3)),  # clean, granted QoS 1
            device(ctx, "ws", 0, websocket=True),  # MQTT over WebSocket
            device(ctx, "p", 1, clean=False),  # persistent
            device(ctx, "p0", 0, clean=False)]  # persistent, QoS 0


@pytest.mark.parametrize("qos", [Qos.STANDARD, Qos.GUARANTEED])
def test_every_session_gets_what_one_message_at_a_time_gave_it(
    monkeypatch: pytest.MonkeyPatch, qos: Qos,
) -> None:
    received = []
    for path in (per_message, hub_module.tell_missed):
        monkeypatch.setattr(hub_module, "tell_missed", path)
        hub, ctx = member(qos)
        devices = sessions(ctx)
        jump(hub, qos)
        hub.apply(message(HELD + JUMP + 1, qos), 0.0)  # live, after
        drain(devices)
        received.append([(d.outbox.take(), d._record and dict(d._record.positions))
                         for d in devices])
    assert received[0] == received[1]
    assert all(wire for wire, _ in received[1])
    packets = mqtt.MqttDecoder(server=False).events(received[1][0][0])
    assert [p.payload.rstrip(b".") for p in packets] == [
        b"m%d" % seq for seq in range(HELD + 1, HELD + JUMP + 2)]


def drain(devices: list[MqttSession]) -> int:
    """What their writers do in their turns of the loop as their sockets drain: refill
    (a QoS 1 session's backlog: mqtt_backlog); the refills that had more to do."""
    refills = 0
    for d in devices:
        while d.refill():
            refills += 1
    return refills


def test_clean_sessions_at_qos_0_take_the_jump_in_a_few_appends_encoded_once(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    hub, ctx = member(Qos.STANDARD)
    devices = [device(ctx, f"c{n}", 0) for n in range(20)]
    with counted(monkeypatch, "encode_publish_from_parts") as encodes:
        jump(hub, Qos.STANDARD)
    for d in devices:
        assert len(d.outbox) <= 3, len(d.outbox)  # before: 200 each
        got = [p.payload.rstrip(b".") for p in read(d)]
        assert got == [b"m%d" % seq for seq in range(HELD + 1, HELD + JUMP + 1)]
    assert encodes == [JUMP]  # before: 20 x 200


@contextmanager
def counted(monkeypatch: pytest.MonkeyPatch, name: str) -> Iterator[list[int]]:
    """Calls of ``mqtt_encode.<name>`` while in it."""
    calls = [0]
    encode = getattr(mqtt_encode, name)

    def counting(*args: object, **kwargs: object) -> object:
        calls[0] += 1
        return encode(*args, **kwargs)

    monkeypatch.setattr(mqtt_encode, name, counting)
    yield calls
    monkeypatch.setattr(mqtt_encode, name, encode)


def test_qos_1_sessions_take_the_jump_in_their_own_turns(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """QoS 1 deliveries have a packet identifier each: nothing to share, and 10,000
    sessions x 400 messages were 4,000,000 deliveries in the hub's step (18.8-20.7 s of
    CPU, docs/benchmarks.md). Now the step queues nothing: each session's backlog is
    delivered in its writer's turns of the loop, a slice (SLICE_UNITS) per refill."""
    hub, ctx = member(Qos.GUARANTEED)
    devices = [device(ctx, f"q{n}", 1) for n in range(10)]
    with counted(monkeypatch, "encode_publish_from_parts") as encodes:
        jump(hub, Qos.GUARANTEED)
    assert encodes == [0]  # before: 10 x 200
    assert all(not d.outbox for d in devices)
    assert all(d.refilling for d in devices)
    per_refill = SLICE_UNITS * MESSAGES_PER_UNIT
    assert drain(devices) == 10 * (JUMP // per_refill)  # then the last one, with less
    for d in devices:
        got = [(p.payload.rstrip(b"."), p.qos, p.packet_id) for p in read(d)]
        assert got == [(b"m%d" % seq, 1, n) for n, seq in enumerate(
            range(HELD + 1, HELD + JUMP + 1), 1)]
        assert not d.refilling


def test_sessions_sending_the_jump_encode_its_topic_once(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Each QoS 1 PUBLISH is its session's own (its packet identifier), the topic is
    not: encoded once for all of them (mqtt_frames.SharedFrames.topic_of). Before, each
    delivery took it from the shared QoS 0 frame, encoded again with an unused QoS 0
    PUBLISH whenever the message changed -- each delivery, a session sending a jump."""
    hub, ctx = member(Qos.GUARANTEED)
    devices = [device(ctx, f"q{n}", 1) for n in range(10)]
    jump(hub, Qos.GUARANTEED)
    with (counted(monkeypatch, "publish_parts") as topics,
          counted(monkeypatch, "encode_publish_from_parts") as publishes):
        drain(devices)
    assert topics[0] <= 1  # before: 10 x 200
    assert publishes == [10 * JUMP]  # one each, its own; before: twice as many
    for d in devices:
        assert [p.payload.rstrip(b".") for p in read(d)] == [
            b"m%d" % seq for seq in range(HELD + 1, HELD + JUMP + 1)]


def test_packets_that_come_before_the_jump_is_sent_wait_for_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A PUBACK, a PINGREQ and a SUBSCRIBE read while the backlog waits are handled once
    it is all delivered -- as when the hub's step sent it before any was read: the same
    bytes, packet identifiers and in-flight window; a live message and a resync that
    came meanwhile follow it, in order."""
    outcomes = []
    for path in (per_message, hub_module.tell_missed):
        monkeypatch.setattr(hub_module, "tell_missed", path)
        hub, ctx = member(Qos.GUARANTEED)
        d = device(ctx, "q", 1, clean=False)
        jump(hub, Qos.GUARANTEED)
        hub.apply(message(HELD + JUMP + 1, Qos.GUARANTEED), 0.0)  # live, after
        hub.reposition(SUBJECT, Position(EPOCH + 1, 7), None, [], 0.0)  # past the cache
        d.receive_data(encode_packet(mqtt.Puback(1)) + encode_packet(mqtt.Pingreq())
                       + encode_packet(mqtt.Subscribe(2, (("a/c", 1),))), 0.0)
        ctx.publishing.settle()  # type: ignore[attr-defined]
        assert not d.refilling
        assert d._record is not None
        outcomes.append((d.outbox.take(), len(d._inflight), dict(d._record.positions)))
    assert outcomes[0] == outcomes[1]
    packets = mqtt.MqttDecoder(server=False).events(outcomes[1][0])
    assert [type(p).__name__ for p in packets[-3:]] == ["Publish", "Pingresp", "Suback"]
    assert packets[-3].retain and not packets[-3].payload  # the resync: an empty RETAIN


def test_live_messages_held_behind_the_jump_count_against_the_client_s_limit() -> None:
    """A client that reads nothing: the live messages held behind its backlog (which
    its writer drains only as its socket does) cut it off as a slow consumer once they
    pass ClientMaxPendingBytes with its outbox, as queued they did (a little later: the
    jump's own bytes are not counted until delivered)."""
    hub, ctx = member(Qos.GUARANTEED, ClientMaxPendingBytes="65536", MaxMessageSize="4096")
    d = device(ctx, "q", 1)
    jump(hub, Qos.GUARANTEED)
    seq = HELD + JUMP
    while not d.closing and seq < HELD + JUMP + 30:
        seq += 1
        hub.apply(Message(SUBJECT, b"x" * 4000, qos=Qos.GUARANTEED, epoch=EPOCH, seq=seq),
                  0.0)
    assert d.closing and ctx.stats.slow_consumers == 1
    assert seq == HELD + JUMP + 17  # 68 kB held: past 64 kB
    assert not d.refilling  # (what it held let go with it)


def test_live_messages_without_content_held_behind_the_jump_count_too() -> None:
    """Each counts HELD_OVERHEAD besides its content: a first version counted the
    content only, and a client that read nothing held every empty message sent."""
    hub, ctx = member(Qos.GUARANTEED, ClientMaxPendingBytes="65536", MaxMessageSize="4096")
    d = device(ctx, "q", 1)
    jump(hub, Qos.GUARANTEED)
    seq = HELD + JUMP
    while not d.closing and seq < HELD + JUMP + 2000:
        seq += 1
        hub.apply(Message(SUBJECT, b"", qos=Qos.GUARANTEED, epoch=EPOCH, seq=seq), 0.0)
    assert d.closing and ctx.stats.slow_consumers == 1
    assert seq == HELD + JUMP + 65536 // HELD_OVERHEAD + 1


@pytest.mark.parametrize("writing", [False, True])
@pytest.mark.parametrize("pending", [0, 10_000, 13_000, 19_000, 25_000, 32_000])
def test_a_persistent_session_records_what_its_outbox_took(
    monkeypatch: pytest.MonkeyPatch, pending: int, writing: bool,
) -> None:
    """Its record moves once a run, to the last message the outbox took: where one
    delivery at a time left it -- but when it is cut off as a slow consumer by a run
    refused whole: then one at a time took the run's first messages before the one that
    passed the limit, recorded them as delivered and dropped them with the cut (its
    resume skipped them); now they are not recorded (its resume replays them)."""
    outcomes = []
    for path in (per_message, hub_module.tell_missed):
        monkeypatch.setattr(hub_module, "tell_missed", path)
        hub, ctx = member(Qos.STANDARD, ClientMaxPendingBytes="32768", MaxMessageSize="4096",
                          MaxBatchingSpace="4096")
        d = device(ctx, "p", 0, clean=False)
        d.outbox.enqueue(b"q" * pending)  # what it has not taken yet
        d._link.writing = writing  # type: ignore[misc]  # (True: its socket is full)
        jump(hub, Qos.STANDARD)  # ~19 kB
        assert d._record is not None
        outcomes.append(((d.closing, ctx.stats.slow_consumers, d.outbox.take()),
                         d._record.positions[SUBJECT].seq))
    (old, old_seq), (new, new_seq) = outcomes
    assert old == new  # the cut, what stays queued (the close)
    cut = new[0]
    assert new_seq == old_seq or (cut and HELD <= new_seq < old_seq)
    if not cut:
        assert new_seq == HELD + JUMP


def test_a_session_that_has_some_of_them_gets_the_rest_once() -> None:
    _, ctx = member(Qos.STANDARD)
    d = device(ctx, "c", 0)
    for seq in range(HELD + 1, HELD + 6):  # it got 4..8 live
        d.deliver_message(message(seq), 0)
    read(d)
    missed = MissedRun([message(seq) for seq in range(HELD + 1, HELD + 11)])
    assert not d.deliver_missed(missed, 0)  # not as runs: one at a time
    hub_module.tell_missed([(d, 0)], missed)
    assert [p.payload.rstrip(b".") for p in read(d)] == [
        b"m%d" % seq for seq in range(HELD + 6, HELD + 11)]


@pytest.mark.parametrize("path", [per_message, hub_module.tell_missed])
def test_a_slow_session_among_them_is_cut_off_alone(
    monkeypatch: pytest.MonkeyPatch, path: object,
) -> None:
    monkeypatch.setattr(hub_module, "tell_missed", path)
    hub, ctx = member(Qos.STANDARD, ClientMaxPendingBytes="32768", MaxMessageSize="4096")
    devices = [device(ctx, f"c{n}", 0) for n in range(4)]
    slow = devices[-1]
    slow.outbox.enqueue(b"q" * 20_000)  # what it has not taken yet
    jump(hub, Qos.STANDARD)  # ~19 kB each
    assert slow.closing and ctx.stats.slow_consumers == 1
    for d in devices[:-1]:
        assert not d.closing
        assert len([p for p in read(d) if isinstance(p, mqtt.Publish)]) == JUMP


steps = st.lists(st.sampled_from(["live", "refill", "puback", "pingreq", "subscribe"]),
                 max_size=12)


class Around:
    """One QoS 1 session and what comes around a jump (the test below)."""

    def __init__(self, clean: bool) -> None:
        self.hub, self.ctx = member(Qos.GUARANTEED)
        self.device = device(self.ctx, "q", 1, clean=clean)
        self.acked = 0

    def play(self, kinds: list[str]) -> None:
        hub, d = self.hub, self.device
        for kind in kinds:
            if kind == "live":
                position = hub.position(SUBJECT)
                assert position is not None
                hub.apply(message(position.seq + 1, Qos.GUARANTEED), 0.0)
            elif kind == "refill":
                d.refill()
            elif kind == "puback":
                self.acked += 1
                d.receive_data(encode_packet(mqtt.Puback(self.acked)), 0.0)
            elif kind == "pingreq":
                d.receive_data(encode_packet(mqtt.Pingreq()), 0.0)
            else:
                d.receive_data(encode_packet(mqtt.Subscribe(7, (("a/c", 1),))), 0.0)
                self.ctx.publishing.settle()  # type: ignore[attr-defined]

    def jump(self) -> None:
        position = self.hub.position(SUBJECT)
        assert position is not None
        to = position.seq + JUMP
        self.hub.reposition(SUBJECT, Position(EPOCH, to), None,
                            [message(s, Qos.GUARANTEED) for s in range(1, to + 1)], 0.0)

    def outcome(self) -> tuple[object, ...]:
        d = self.device
        drain([d])
        return d.outbox.take(), len(d._inflight), d._record and dict(d._record.positions)


@settings(max_examples=60, deadline=None)
@given(before=steps, after=steps, clean=st.booleans())
def test_whatever_comes_around_the_jump_the_session_ends_as_one_at_a_time_left_it(
    before: list[str], after: list[str], clean: bool,
) -> None:
    """Live messages, refills (the writer's turns), the client's PUBACKs, PINGREQs and
    SUBSCRIBEs in any order before and after the jump: the same bytes, in-flight window
    and record as when the hub's step sent the jump one message at a time."""
    outcomes = []
    for path in (per_message, hub_module.tell_missed):
        with pytest.MonkeyPatch.context() as patch:
            patch.setattr(hub_module, "tell_missed", path)
            around = Around(clean)
            around.play(before)
            around.jump()
            around.play(after)
            outcomes.append(around.outcome())
    assert outcomes[0] == outcomes[1]
