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
