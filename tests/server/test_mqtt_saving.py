"""Saving a persistent MQTT session's record (migratory/server/mqtt_saving.py, the record's
format in mqtt_store.py): a save carries only what changed; the saved parts resume the
session after a restart; a damaged record is refused with a warning, not a crash."""

from __future__ import annotations

import json
import logging

import pytest
from test_mqtt_session import HeldPublishing, make, read, session

from migratory.config import Config
from migratory.entitlement import entitlement_from_config
from migratory.model.message import Message, Qos
from migratory.model.position import Position
from migratory.protocol import mqtt, ops
from migratory.protocol.mqtt_encode import encode_packet
from migratory.server import mqtt_saving, mqtt_store
from migratory.server.app import build_hub
from migratory.server.context import ServerContext, ServerStatistics
from migratory.server.mqtt_session import MqttSession
from migratory.server.mqtt_store import (
    GENERATION,
    SAVED_AT,
    SESSION_CLOSURE,
    WRITER,
    decode_record,
    session_subject,
)


def saves(held: HeldPublishing, client_id: str) -> list[Message]:
    """The saves of ``client_id``'s record waiting in ``held``."""
    return [m for m, _ in held.held if m.subject == session_subject(client_id)]


def saved_bytes(save: Message) -> int:
    return len(save.content) + sum(len(k) + len(v) for k, v in save.fields.items())


def test_a_save_carries_only_the_positions_that_changed(monkeypatch: pytest.MonkeyPatch) -> None:
    """Before, each save was the whole record: here 5,000 positions, ~150 kB per save
    (50 such sessions: 1.3 s of CPU per second, benchmarks/mqtt_session_save.py)."""
    now = [100.0]
    monkeypatch.setattr(mqtt_saving, "clock", lambda: now[0])
    ctx, held = make(MaxPublishesPerSecond="0")
    publisher = session(ctx, "pub", {})
    publisher.receive_data(b"".join(
        encode_packet(mqtt.Publish(f"s/n{i}", b"x")) for i in range(5000)), 0.0)
    held.settle()
    device = session(ctx, "dev", {}, clean_session=False)
    device.receive_data(encode_packet(mqtt.Subscribe(1, (("s/+", 0),))), 0.0)
    (first,) = saves(held, "dev")  # the SUBACK's: every position is new
    assert saved_bytes(first) > 5000 * 10
    held.settle()
    assert read(device)[-1] == mqtt.Suback(1, (0,))

    now[0] += mqtt_saving.SAVE_INTERVAL
    for i in range(3):  # three subjects change; one save, after the first of them
        publisher.receive_data(encode_packet(mqtt.Publish(f"s/n{i}", b"y")), 0.0)
    held.settle()
    (second,) = saves(held, "dev")
    assert saved_bytes(second) < 200  # the head (one filter) and one position
    assert set(second.fields) == {SAVED_AT, GENERATION, WRITER, "/s/n0"}
    held.settle()
    now[0] += mqtt_saving.SAVE_INTERVAL
    publisher.receive_data(encode_packet(mqtt.Publish("s/n9", b"y")), 0.0)
    held.settle()
    (third,) = saves(held, "dev")  # the two left over, and the new one
    assert {n for n in third.fields if n.startswith("/")} == {"/s/n1", "/s/n2", "/s/n9"}
    held.settle()
    record = decode_record(ctx.hub.snapshot(session_subject("dev")))
    assert record is not None and len(record.positions) == 5000  # the snapshot holds all
    for subject in ("/s/n0", "/s/n1", "/s/n2", "/s/n9", "/s/n100"):
        assert record.positions[subject] == ctx.hub.position(subject)


def _ack(device: MqttSession, packets: list[mqtt.Packet], payloads: set[bytes]) -> None:
    for p in packets:
        if isinstance(p, mqtt.Publish) and p.payload in payloads:
            device.receive_data(encode_packet(mqtt.Puback(p.packet_id or 0)), 0.0)


def test_the_positions_of_a_failed_save_go_into_the_next(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A save refused (a cluster that lost its majority) closes the connection, whose end
    saves again: with the positions the failed save carried. (A guard: a whole record
    carried them anyway.)"""
    now = [100.0]
    monkeypatch.setattr(mqtt_saving, "clock", lambda: now[0])
    ctx, held = make()
    device = session(ctx, "dev", {}, clean_session=False)
    device.receive_data(encode_packet(mqtt.Subscribe(1, (("a/b", 0),))), 0.0)
    held.settle()
    now[0] += mqtt_saving.SAVE_INTERVAL
    publisher = session(ctx, "pub", {})
    publisher.receive_data(encode_packet(mqtt.Publish("a/b", b"1")), 0.0)
    held.settle()  # delivered: its position is saved
    held.held, failed = [], held.held
    ((save, reply),) = failed
    assert save.subject == session_subject("dev") and reply is not None
    reply.publish_result(ops.PublishStatus(ops.Status.PUBLISH_FAILED, SESSION_CLOSURE,
                                           save.subject, None, "no majority"))
    assert device.closing
    assert len(saves(held, "dev")) == 1  # the connection's end
    held.settle()
    record = decode_record(ctx.hub.snapshot(session_subject("dev")))
    assert record is not None and record.positions["/a/b"] == ctx.hub.position("/a/b")


def test_a_restarted_server_resumes_the_session_from_its_saved_parts() -> None:
    """A seed restarted from its Raft log applies every committed message again: the
    record's saves, in order, make the same snapshot. The session resumes from its
    positions: what it acknowledged is not delivered again, nothing is skipped. (A guard:
    whole records resumed too; the saves are parts now.)"""
    ctx, held = make()
    registry: dict = {}
    device = session(ctx, "dev", registry, clean_session=False)
    device.receive_data(encode_packet(mqtt.Subscribe(1, (("a/+", 1),))), 0.0)
    held.settle()
    publisher = session(ctx, "pub", registry)
    for i, topic in enumerate(["a/x", "a/y", "a/x", "a/y", "a/x", "a/z"]):
        publisher.receive_data(
            encode_packet(mqtt.Publish(topic, b"%s%d" % (topic[-1].encode(), i), qos=1,
                                       packet_id=i + 1)), 0.0)
    held.settle()
    _ack(device, read(device), {b"x0", b"y1", b"x2", b"y3"})  # not x4, z5
    device.connection_lost()
    held.settle()
    held.settle()

    config = Config.from_mapping({})
    restarted = build_hub(config)
    for subject in ctx.hub.subject_names():  # the log again, each subject's in order
        position = ctx.hub.position(subject)
        assert position is not None
        for message in ctx.hub.missed(subject, Position(position.epoch, 0)) or ():
            assert restarted.apply(message, 0.0)
    ctx2 = ServerContext(config, restarted, entitlement_from_config(config),
                         ServerStatistics(), HeldPublishing(restarted))
    back = session(ctx2, "dev", {}, clean_session=False)
    packets = read(back)
    assert packets[0] == mqtt.Connack(True, 0)
    while back.subscriptions.busy:
        back.subscriptions.work(1000)
    packets += read(back)
    assert sorted(p.payload for p in packets if isinstance(p, mqtt.Publish)) == [b"x4", b"z5"]


def _store(ctx: ServerContext, client_id: str, content: bytes, fields: dict[str, str]) -> None:
    ctx.hub.publish(Message(session_subject(client_id), content, fields, retained=True,
                            qos=Qos.GUARANTEED, closure=SESSION_CLOSURE), 0.0)


def test_a_damaged_record_is_refused_with_a_warning_not_a_crash(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A position that cannot be read is refused (logged): its subject is replayed from
    the start of its cache -- at least once, never a gap --, the others resume from
    theirs. A head that cannot be read (a torn write) refuses the record, logged: the
    client gets a fresh session (session present 0)."""
    ctx, held = make()
    publisher = session(ctx, "pub", {})
    for i in range(3):
        for topic in ("a/x", "a/y"):
            publisher.receive_data(encode_packet(mqtt.Publish(topic, b"%d" % i)), 0.0)
    held.settle()
    epoch = ctx.hub.position("/a/x").epoch  # type: ignore[union-attr]
    head = json.dumps({"generation": 1, "lineage": 1, "filters": {"a/+": 0},
                       "positions": {}}).encode()
    saved_at = str(int(mqtt_store.wall_clock()))
    _store(ctx, "dev", head, {SAVED_AT: saved_at, GENERATION: "1",
                              "/a/x": f"1:{epoch}:2", "/a/y": f"1:{epoch}"})  # torn value
    caplog.set_level(logging.WARNING, logger="migratory.mqtt")
    device = session(ctx, "dev", {}, clean_session=False)
    packets = read(device)
    while device.subscriptions.busy:
        device.subscriptions.work(1000)
    packets += read(device)
    assert packets[0] == mqtt.Connack(True, 0)
    delivered = sorted((p.topic, p.payload) for p in packets if isinstance(p, mqtt.Publish))
    assert delivered == [("a/x", b"2"), ("a/y", b"0"), ("a/y", b"1"), ("a/y", b"2")]
    assert "1 saved position(s) cannot be read ('/a/y'" in caplog.text

    caplog.clear()
    _store(ctx, "torn", head[: len(head) // 2], {SAVED_AT: saved_at, GENERATION: "1"})
    torn = session(ctx, "torn", {}, clean_session=False)
    assert read(torn) == [mqtt.Connack(False, 0)] and not torn.closing
    assert f"session record {session_subject('torn')} cannot be read" in caplog.text


def _publish_each(ctx: ServerContext, held: HeldPublishing, topics: list[str]) -> None:
    """One message to each of ``topics`` (by a clean publisher), settled with the saves."""
    publisher = session(ctx, "pub", {})
    for start in range(0, len(topics), 1000):
        publisher.receive_data(b"".join(encode_packet(mqtt.Publish(t, b"x"))
                                        for t in topics[start:start + 1000]), 0.0)
        held.settle()
        held.settle()


def _caught_up(device: MqttSession) -> list[mqtt.Packet]:
    packets = read(device)
    while device.subscriptions.busy:
        device.subscriptions.work(1000)
        packets += read(device)
    return packets


def test_a_wildcard_session_record_names_at_most_MqttSessionMaxSubjects(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture,
) -> None:
    """A persistent '#' session gained a position for every subject it was delivered,
    without bound: 10,500 subjects, 10,500 positions in its record and fields in its
    snapshot, on every member (30,000: 853 kB). At the default MqttSessionMaxSubjects
    (10,000) it names the 10,000 delivered last; the 500 others are forgotten -- counted,
    logged once -- and a resume replays them from the start of their cache (at least
    once), the others from their positions (nothing here)."""
    monkeypatch.setattr(mqtt_saving, "bound_log", mqtt_saving._BoundLog())
    caplog.set_level(logging.WARNING, logger="migratory.mqtt")
    ctx, held = make(MaxPublishesPerSecond="0")
    registry: dict = {}
    device = session(ctx, "dev", registry, clean_session=False)
    device.receive_data(encode_packet(mqtt.Subscribe(1, (("#", 0),))), 0.0)
    held.settle()
    topics = [f"s{i % 50}/n{i}" for i in range(10_500)]
    _publish_each(ctx, held, topics)
    assert len(read(device)) == 2 + 10_500  # CONNACK, SUBACK, every message
    device.connection_lost()
    held.settle()
    record = device._record
    assert record is not None and len(record.positions) == 10_000  # was 10,500
    snapshot = ctx.hub.snapshot(session_subject("dev"))
    assert snapshot is not None
    assert sum(name.startswith("/") for name in snapshot.fields) == 10_000
    stored = decode_record(snapshot)
    assert stored is not None and set(stored.positions) == {"/" + t for t in topics[500:]}
    assert ctx.stats.mqtt_session_positions_forgotten == 500
    assert ctx.stats.mqtt_sessions_over_subject_bound == 1
    lines = [r for r in caplog.records if "MqttSessionMaxSubjects (10000)" in r.getMessage()]
    assert len(lines) == 1

    back = session(ctx, "dev", registry, clean_session=False)
    packets = _caught_up(back)
    assert packets[0] == mqtt.Connack(True, 0)
    replayed = sorted(p.topic for p in packets if isinstance(p, mqtt.Publish))
    assert replayed == sorted(topics[:500])  # once each, from the start of the cache


def test_the_bound_keeps_the_subjects_named_by_a_filter(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A subject subscribed to by name (no wildcard) is never forgotten, however quiet: a
    resume finds the subjects a record does not name through the wildcard filters only,
    so a forgotten 'alarm/main' would get what it missed only at its next message. The
    positions delivered least recently go instead, and a message it missed while away
    comes at the resume."""
    monkeypatch.setattr(mqtt_saving, "bound_log", mqtt_saving._BoundLog())
    ctx, held = make(MaxPublishesPerSecond="0", MqttSessionMaxSubjects="1000")
    registry: dict = {}
    _publish_each(ctx, held, ["alarm/main"])
    device = session(ctx, "dev", registry, clean_session=False)
    device.receive_data(encode_packet(mqtt.Subscribe(1, (("alarm/main", 0), ("t/#", 0)))), 0.0)
    held.settle()
    _publish_each(ctx, held, [f"t/n{i}" for i in range(1100)])
    device.connection_lost()
    held.settle()
    held.settle()
    stored = decode_record(ctx.hub.snapshot(session_subject("dev")))
    assert stored is not None and len(stored.positions) == 1000
    assert "/alarm/main" in stored.positions and "/t/n100" not in stored.positions
    _publish_each(ctx, held, ["alarm/main"])  # while the device is away
    back = session(ctx, "dev", registry, clean_session=False)
    missed = [p.topic for p in _caught_up(back) if isinstance(p, mqtt.Publish)]
    assert missed.count("alarm/main") == 1 and len(missed) == 1 + 101  # and t/n0..t/n100


def test_a_stored_record_over_the_bound_is_resumed_whole_then_bounded(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A record saved under a higher MqttSessionMaxSubjects (or by an earlier version,
    unbounded): the resume goes from every position it names, and its first save here
    forgets the excess (empty fields: the snapshot then names 1,000)."""
    monkeypatch.setattr(mqtt_saving, "bound_log", mqtt_saving._BoundLog())
    ctx, held = make(MaxPublishesPerSecond="0")
    registry: dict = {}
    device = session(ctx, "dev", registry, clean_session=False)
    device.receive_data(encode_packet(mqtt.Subscribe(1, (("t/+", 0),))), 0.0)
    held.settle()
    _publish_each(ctx, held, [f"t/n{i}" for i in range(1500)])
    device.connection_lost()
    held.settle()
    held.settle()

    lower = ServerContext(Config.from_mapping({"MqttSessionMaxSubjects": "1000"}), ctx.hub,
                          ctx.entitlement, ServerStatistics(), held)
    back = session(lower, "dev", registry, clean_session=False)
    assert [p for p in _caught_up(back) if isinstance(p, mqtt.Publish)] == []  # nothing missed
    held.settle()
    snapshot = ctx.hub.snapshot(session_subject("dev"))
    assert snapshot is not None
    assert sum(name.startswith("/") for name in snapshot.fields) == 1000
    assert lower.stats.mqtt_session_positions_forgotten == 500


def test_sessions_reaching_the_bound_together_log_one_line(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture,
) -> None:
    """Each session's first time is logged, at most one line per BOUND_LOG_INTERVAL over
    all sessions; the next line counts the sessions not logged. Every one is counted."""
    now = [100.0]
    monkeypatch.setattr(mqtt_saving, "clock", lambda: now[0])
    monkeypatch.setattr(mqtt_saving, "bound_log", mqtt_saving._BoundLog())
    caplog.set_level(logging.WARNING, logger="migratory.mqtt")
    ctx, held = make(MaxPublishesPerSecond="0", MqttSessionMaxSubjects="1000")
    devices = []
    for n in range(4):
        device = session(ctx, f"dev{n}", {}, clean_session=False)
        device.receive_data(encode_packet(mqtt.Subscribe(1, ((f"d{n}/+", 0),))), 0.0)
        devices.append(device)
    held.settle()
    for n in range(3):
        _publish_each(ctx, held, [f"d{n}/n{i}" for i in range(1001)])
        devices[n].connection_lost()
        held.settle()
    now[0] += mqtt_saving.BOUND_LOG_INTERVAL
    _publish_each(ctx, held, [f"d3/n{i}" for i in range(1001)])
    devices[3].connection_lost()
    held.settle()
    assert ctx.stats.mqtt_sessions_over_subject_bound == 4
    assert ctx.stats.mqtt_session_positions_forgotten == 4
    lines = [r.getMessage() for r in caplog.records if "MqttSessionMaxSubjects" in r.getMessage()]
    assert len(lines) == 2
    assert "dev0" in lines[0] and "dev3" in lines[1]
    assert "(2 more sessions like it not logged)" in lines[1]


def test_a_late_save_of_a_replaced_connection_does_not_bring_a_discarded_session_back() -> (
    None
):
    """The session's connection ends on one worker (or member) just as its client's
    clean CONNECT discards the session on another: its last save, checked against its
    own snapshot before the discard reached it, is numbered after the discard. Before,
    that save brought the session back (filters and all): the client's next CONNECT with
    clean session 0 got session present and subscriptions it had discarded."""
    ctx, held = make()
    device = session(ctx, "dev", {}, clean_session=False)
    device.receive_data(encode_packet(mqtt.Subscribe(1, (("a/+", 1),))), 0.0)
    held.settle()
    stored = ctx.hub.snapshot(session_subject("dev"))
    device.connection_lost()  # its last save: held, as on its way to the sequencer
    (late,) = saves(held, "dev")
    # meanwhile, elsewhere, a clean CONNECT's discard is numbered first
    discard = mqtt_store.discard_message("dev", mqtt_store.stored_generation(stored) + 1,
                                         stored)
    held.local.submit(discard, None, 0.0)
    held.settle()  # then the late save
    assert int(late.fields[GENERATION]) < int(discard.fields[GENERATION])
    assert decode_record(ctx.hub.snapshot(session_subject("dev"))) is None
    again = session(ctx, "dev", {}, clean_session=False)
    assert read(again) == [mqtt.Connack(False, 0)]


def test_a_saved_position_never_passes_a_qos1_delivery_not_acknowledged(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """What a member's kill leaves is the last save: it must not name a position past a
    QoS 1 message the client has not PUBACKed, or the resume skips it. A QoS 0 delivery
    of the subject (a ``standard`` message, queued) does not move it on meanwhile; nor
    does a PUBACK of a later QoS 1 message sent before the earlier one's (a client that
    acknowledges out of order). Before, that PUBACK saved the later position: m1 lost."""
    now = [100.0]
    monkeypatch.setattr(mqtt_saving, "clock", lambda: now[0])
    ctx, held = make()
    device = session(ctx, "dev", {}, clean_session=False)
    device.receive_data(encode_packet(mqtt.Subscribe(1, (("a/b", 1),))), 0.0)
    held.settle()
    publisher = session(ctx, "pub", {})
    for payload, qos in ((b"m1", 1), (b"m2", 0), (b"m3", 1), (b"m4", 0)):
        publisher.receive_data(encode_packet(
            mqtt.Publish("a/b", payload, qos=qos, packet_id=qos or None)), 0.0)
        held.settle()
    sent = {p.payload: p for p in read(device) if isinstance(p, mqtt.Publish)}
    assert [sent[m].qos for m in (b"m1", b"m2", b"m3", b"m4")] == [1, 0, 1, 0]

    def saved() -> Position:
        now[0] += mqtt_saving.SAVE_INTERVAL
        device.save_record()
        held.settle()
        record = decode_record(ctx.hub.snapshot(session_subject("dev")))
        assert record is not None
        return record.positions["/a/b"]

    first = ctx.hub.position("/a/b")
    assert first is not None
    m1 = Position(first.epoch, first.seq - 3)
    assert saved() < m1  # m1 not acknowledged: m2 (QoS 0) does not move it on
    device.receive_data(encode_packet(mqtt.Puback(sent[b"m3"].packet_id or 0)), 0.0)
    assert saved() < m1, "a PUBACK of m3 saved a position past m1, not acknowledged"
    device.receive_data(encode_packet(mqtt.Puback(sent[b"m1"].packet_id or 0)), 0.0)
    assert saved() == Position(first.epoch, first.seq - 1)  # m1..m3: every one acknowledged


def test_positions_changed_within_the_interval_are_saved_once_it_has_passed(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A device that gets a burst, acknowledges it and goes quiet: its positions, changed
    within SAVE_INTERVAL of the save before, are saved once the interval has passed (the
    server's tick: save_due_positions), not only with its next change or its connection's
    end. Before, nothing saved them: a kill of its member an hour later made its resume
    replay the whole burst -- or, past the cache, resync it (an empty RETAIN: the client
    drops its state) -- where docs/mqtt.md promised about a second of messages again."""
    now = [100.0]
    monkeypatch.setattr(mqtt_saving, "clock", lambda: now[0])
    ctx, held = make()
    device = session(ctx, "dev", {}, clean_session=False)
    device.receive_data(encode_packet(mqtt.Subscribe(1, (("s/x", 1),))), 0.0)
    held.settle()  # the SUBACK's save, at 100.0
    publisher = session(ctx, "pub", {})
    publisher.receive_data(b"".join(encode_packet(mqtt.Publish("s/x", b"m%d" % i, qos=1,
                                                               packet_id=i + 1))
                                    for i in range(5)), 0.0)
    held.settle()
    delivered = [p for p in read(device) if isinstance(p, mqtt.Publish)]
    assert len(delivered) == 5
    device.receive_data(b"".join(encode_packet(mqtt.Puback(p.packet_id)) for p in delivered),
                        0.0)
    assert saves(held, "dev") == []  # within the interval: deferred
    now[0] += mqtt_saving.SAVE_INTERVAL / 2
    assert mqtt_saving.save_due_positions(ctx.mqtt_saves_due) == 0  # not due yet
    now[0] += mqtt_saving.SAVE_INTERVAL
    assert mqtt_saving.save_due_positions(ctx.mqtt_saves_due) == 1
    (save,) = saves(held, "dev")
    assert save.fields["/s/x"].endswith(":5")
    held.settle()
    assert mqtt_saving.save_due_positions(ctx.mqtt_saves_due) == 0 and not ctx.mqtt_saves_due


def test_a_suback_waits_for_the_save_that_carries_its_filter() -> None:
    """A SUBSCRIBE while an earlier save is in flight: its filter goes into the next
    save, and its SUBACK waits for that one (docs/mqtt.md: after a SUBACK the
    subscription survives any member failure). Before, the landing of the earlier save
    sent it: a member killed then lost a filter the client was told it had."""
    ctx, held = make()
    device = session(ctx, "dev", {}, clean_session=False)
    device.receive_data(encode_packet(mqtt.Subscribe(1, (("a/b", 1),))), 0.0)
    held.settle()
    assert mqtt.Suback(1, (1,)) in read(device)
    device.receive_data(encode_packet(mqtt.Subscribe(2, (("c/d", 1),))), 0.0)
    device.receive_data(encode_packet(mqtt.Subscribe(3, (("e/f", 1),))), 0.0)
    (in_flight,) = saves(held, "dev")  # c/d's; e/f waits for the next
    assert "e/f" not in json.loads(in_flight.content)["filters"]
    held.settle()  # c/d's save lands, e/f's is submitted
    assert [p for p in read(device) if isinstance(p, mqtt.Suback)] == [mqtt.Suback(2, (1,))]
    held.settle()
    assert [p for p in read(device) if isinstance(p, mqtt.Suback)] == [mqtt.Suback(3, (1,))]
    stored = decode_record(ctx.hub.snapshot(session_subject("dev")))
    assert stored is not None and set(stored.filters) == {"a/b", "c/d", "e/f"}


def test_deferred_saves_are_made_a_bounded_number_per_tick(monkeypatch: pytest.MonkeyPatch) -> None:
    """Sessions given a message together are due together: a tick saves at most
    SAVES_PER_TICK of them (here 2), the next tick the rest."""
    now = [100.0]
    monkeypatch.setattr(mqtt_saving, "clock", lambda: now[0])
    ctx, held = make()
    devices = [session(ctx, f"dev{n}", {}, clean_session=False) for n in range(3)]
    for device in devices:
        device.receive_data(encode_packet(mqtt.Subscribe(1, (("s/x", 0),))), 0.0)
    held.settle()
    publisher = session(ctx, "pub", {})
    publisher.receive_data(encode_packet(mqtt.Publish("s/x", b"m")), 0.0)
    held.settle()
    assert len(ctx.mqtt_saves_due) == 3
    now[0] += mqtt_saving.SAVE_INTERVAL
    assert mqtt_saving.save_due_positions(ctx.mqtt_saves_due, most=2) == 2
    assert mqtt_saving.save_due_positions(ctx.mqtt_saves_due, most=2) == 1
    assert sorted(m.subject for m, _ in held.held) == sorted(
        session_subject(f"dev{n}") for n in range(3))
