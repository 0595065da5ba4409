"""A persistent MQTT session's catch-up (migratory/server/mqtt_resume.py) counts in the
event loop's turns as a WebSocket resume does (session_subscriptions: MESSAGES_PER_UNIT
messages an operation), and a step starts no slice that could pass its budget. Without
I/O (helpers from test_mqtt_session); counted, never timed."""

from __future__ import annotations

import logging

import pytest
from test_mqtt_session import Wire, make, read, session

from migratory import client_lines
from migratory.protocol import mqtt
from migratory.protocol.mqtt_encode import encode_packet
from migratory.server.mqtt_input import SLICE_OPERATIONS
from migratory.server.mqtt_session import MqttSession
from migratory.server.session_subscriptions import MESSAGES_PER_UNIT

TOPICS = [f"herd/s{i}" for i in range(10)]
MISSED = 300


def away_while_published(**settings: str) -> tuple[MqttSession, dict, object]:
    """A persistent session on TOPICS, away while MISSED messages of each are published;
    the publisher, the sessions' registry and the context."""
    ctx, held = make(MaxPublishesPerSecond="0", ClientMaxPendingBytes="100000000", **settings)
    registry: dict = {}
    publisher = session(ctx, "pub", {})
    device = session(ctx, "dev", registry, clean_session=False)
    device.receive_data(encode_packet(mqtt.Subscribe(1, tuple((t, 0) for t in TOPICS))), 0.0)
    held.settle()
    device.connection_lost()
    held.settle()
    publisher.receive_data(b"".join(encode_packet(mqtt.Publish(t, b"%d" % n))
                                    for n in range(MISSED) for t in TOPICS), 0.0)
    held.settle()
    return publisher, registry, ctx


def test_a_resumed_session_counts_the_messages_it_is_sent_as_a_websocket_does() -> None:
    """10 subjects of 300 missed messages each, a step of 64 operations at a time: each
    step counts (work_done, what the loop's turn is charged) at least one operation per
    MESSAGES_PER_UNIT messages it sent. A message counted as a visit of the subject
    index (1/250 of an operation): a step sent 2,000 of them and counted 9, a turn of
    the loop sent ~57,000 (2,000 persistent sessions coming back held the loop 1.4 s:
    docs/benchmarks.md). Every message comes once, in order."""
    _, registry, ctx = away_while_published()
    back = MqttSession(ctx, Wire(), "127.0.0.1:1", registry)  # type: ignore[arg-type]
    done = back.work_done
    more = back.receive_data(encode_packet(mqtt.Connect("dev", clean_session=False)), 0.0,
                             budget=64)
    steps = [(read(back), back.work_done - done)]
    while more and len(steps) < 1000:
        done = back.work_done
        more = back.process(0.0, 64)
        steps.append((read(back), back.work_done - done))
    assert steps[0][0][0] == mqtt.Connack(True, 0)
    for packets, counted in steps:
        sent = sum(isinstance(p, mqtt.Publish) for p in packets)
        assert counted >= sent // MESSAGES_PER_UNIT, (sent, counted)
    got = [(p.topic, p.payload) for packets, _ in steps for p in packets
           if isinstance(p, mqtt.Publish)]
    for topic in TOPICS:
        assert [payload for t, payload in got if t == topic] == [
            b"%d" % n for n in range(MISSED)]
    assert len(got) == len(TOPICS) * MISSED


def test_a_connect_let_in_with_a_small_reservation_starts_no_slice() -> None:
    """A connection let in from the loop's queue with new bytes has 2 operations reserved
    (loop_turns.FRESH_STEP): its CONNECT is one, and a slice of the resume (up to
    SLICE_OPERATIONS) is not started in that step -- it was: 128 such CONNECTs let in per
    turn made turns of 1,064 operations where the budget is 256 (benchmark). The slice
    comes in the connection's next step."""
    _, registry, ctx = away_while_published()
    back = MqttSession(ctx, Wire(), "127.0.0.1:1", registry)  # type: ignore[arg-type]
    assert back.receive_data(encode_packet(mqtt.Connect("dev", clean_session=False)), 0.0,
                             budget=2)
    assert read(back) == [mqtt.Connack(True, 0)]
    assert back.work_done == 1
    assert back.process(0.0, 2 + SLICE_OPERATIONS)
    assert any(isinstance(p, mqtt.Publish) for p in read(back))


def test_a_resume_logs_what_it_did_with_the_positions_of_the_subjects_up_to_date(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Chaos seed 1176: a session resumed on a non-seed "up to date" on five subjects
    whose messages its client never had, and no line told which positions its record
    named (only resyncs were logged). The resume's line now says what it replayed, what
    it resynced and, by name and seq, what it found up to date."""
    _, registry, ctx = away_while_published()
    back = MqttSession(ctx, Wire(), "127.0.0.1:1", registry)  # type: ignore[arg-type]
    with caplog.at_level(logging.INFO, logger="migratory.mqtt"):
        client_lines.lines = client_lines.ClientLines()  # no line of this kind held back
        more = back.receive_data(encode_packet(mqtt.Connect("dev", clean_session=False)),
                                 0.0, budget=64)
        while more:
            more = back.process(0.0, 64)
    (line,) = [r.getMessage() for r in caplog.records if "session resumed" in r.getMessage()]
    assert f"{len(TOPICS)} subject(s) replayed ({len(TOPICS) * MISSED} messages)" in line
    assert "0 from their snapshot, 0 up to date" in line
    caplog.clear()
    read(back)
    back.connection_lost()  # its positions saved
    for _ in range(2):  # the save in flight, then the last one it held back
        ctx.publishing.settle()  # type: ignore[attr-defined]
    again = MqttSession(ctx, Wire(), "127.0.0.1:2", registry)  # type: ignore[arg-type]
    with caplog.at_level(logging.INFO, logger="migratory.mqtt"):
        client_lines.lines = client_lines.ClientLines()
        more = again.receive_data(encode_packet(mqtt.Connect("dev", clean_session=False)),
                                  0.0, budget=64)
        while more:
            more = again.process(0.0, 64)
    (line,) = [r.getMessage() for r in caplog.records if "session resumed" in r.getMessage()]
    assert f"0 subject(s) replayed (0 messages), 0 from their snapshot, {len(TOPICS)} up to " \
           "date (" in line
    assert f"/herd/s0@{MISSED}" in line
