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
    assert set(second.fields) == {SAVED_AT, GENERATION, "/s/n0"}
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
