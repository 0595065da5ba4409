"""migratory/server/hub_sinks.py: a subject that is not valid, applied as committed (an
older member's Raft log, docs/cluster.md), is matched by no MQTT filter.

Before, a member with the ClusterPassword could have one numbered (cluster link
publishes were not checked; now they are, cluster/link_publishes.py) and every member
fanned it out to its MQTT ``#`` subscribers: a subject of 70,000 bytes made the delivery
raise in the hub (``ValueError: a string or binary field is at most 65535 bytes``, in
the committed stream of every member), a NUL went out as a topic the device's decoder
refuses (it drops the connection), ``Stocks/IBM`` as topic ``tocks/IBM``.
"""

from __future__ import annotations

import logging

import pytest
from test_mqtt_session import make, read, session

from migratory.model.message import Message
from migratory.model.position import new_position
from migratory.protocol import mqtt
from migratory.protocol.mqtt_encode import encode_packet

INVALID = ["/a/" + "x" * 70_000, "/a/b\x00", "Stocks/IBM", "/Stocks//IBM", ""]


def test_committed_messages_of_invalid_subjects_keep_their_positions_and_reach_no_filter(
    caplog: pytest.LogCaptureFixture,
) -> None:
    ctx, held = make()  # (its hub built by build_hub: invalid subjects said in the log)
    device = session(ctx, "dev", {})
    device.receive_data(encode_packet(mqtt.Subscribe(1, (("#", 0),))), 0.0)
    held.settle()
    read(device)
    caplog.set_level(logging.WARNING, logger="migratory.hub")
    for subject in [*INVALID, "/Stocks/IBM"]:
        for seq in (1, 2):  # as a member applies the committed stream
            assert ctx.hub.apply(Message(subject, b"x", epoch=5, seq=seq), 0.0)
    for subject in INVALID:  # applied: no position vanished
        assert ctx.hub.position(subject) == new_position(5, 2)
    delivered = [p.topic for p in read(device) if isinstance(p, mqtt.Publish)]
    assert delivered == ["Stocks/IBM", "Stocks/IBM"]
    assert not device.closing
    warnings = [r.getMessage() for r in caplog.records]
    assert len(warnings) == 1 and "invalid subject '/a/xxx" in warnings[0]


WILDCARD_SUBJECTS = ["/a/x+y", "/a/+", "/a/b#", "/a/#", "/a/+/c"]  # valid subjects


def test_a_subject_holding_a_wildcard_reaches_no_mqtt_filter_live_retained_or_resync() -> None:
    """A subject with ``+`` or ``#`` is valid natively and over HTTP, but names no MQTT
    topic: the server may not send one as a PUBLISH's topic name (MQTT 3.1.1 [MQTT-3.3.2-2]: strict
    clients close the connection). Before, ``#``, ``a/+``, ``a/+/c`` sent all five as
    retained messages at the SUBSCRIBE (failed: ``['a/x+y', 'a/+', ..., 'a/+/c']``),
    live, and at a resync. Now no filter matches one; counted
    (``mqtt_unnamable_messages``) per message."""
    ctx, _ = make()
    for subject in [*WILDCARD_SUBJECTS, "/a/b"]:  # retained before the subscribe
        assert ctx.hub.apply(Message(subject, b"r", retained=True, epoch=5, seq=1), 0.0)
    device = session(ctx, "dev", {})
    read(device)
    more = device.receive_data(encode_packet(mqtt.Subscribe(
        1, (("#", 0), ("a/+", 1), ("a/+/c", 0)))), 0.0, budget=64)
    while more:
        more = device.process(0.0, 64)
    retained = [p.topic for p in read(device) if isinstance(p, mqtt.Publish)]
    assert retained == ["a/b"]
    for subject in [*WILDCARD_SUBJECTS, "/a/b"]:  # live
        assert ctx.hub.apply(Message(subject, b"l", epoch=5, seq=2), 0.0)
    live = [p.topic for p in read(device) if isinstance(p, mqtt.Publish)]
    assert live == ["a/b"]
    for subject in [*WILDCARD_SUBJECTS, "/a/b"]:  # a cache sync past the cache: resync
        snapshot = Message(subject, b"s", retained=True, epoch=5, seq=100)
        ctx.hub.reposition(subject, snapshot.position, snapshot, [], 0.0)
    resynced = [(p.topic, p.retain) for p in read(device) if isinstance(p, mqtt.Publish)]
    assert resynced == [("a/b", True)]
    # counted once a message told (live, and the resync): the filters held meanwhile
    assert ctx.hub.statistics().mqtt_unnamable_messages == 2 * len(WILDCARD_SUBJECTS)
    assert not device.closing


def test_a_resumed_wildcard_session_catches_up_on_no_subject_holding_a_wildcard() -> None:
    """A persistent '#' session away while /a/x+y and /a/b got messages: its resume's
    catch-up (mqtt_resume, the subjects its filters match) sends /a/b's only. Before,
    it sent /a/x+y's too, with that topic name."""
    ctx, held = make()
    registry: dict = {}
    device = session(ctx, "dev", registry, clean_session=False)
    device.receive_data(encode_packet(mqtt.Subscribe(1, (("#", 1),))), 0.0)
    held.settle()
    read(device)
    device.connection_lost()
    held.settle()
    held.settle()
    for seq, subject in enumerate(["/a/x+y", "/a/b", "/a/#"], start=1):
        assert ctx.hub.apply(Message(subject, b"m", epoch=5, seq=seq), 0.0)
    back = session(ctx, "dev", registry, clean_session=False)
    more = True
    while more:
        more = back.process(0.0, 64)
    packets = read(back)
    assert packets[0] == mqtt.Connack(True, 0)
    assert [p.topic for p in packets if isinstance(p, mqtt.Publish)] == ["a/b"]
