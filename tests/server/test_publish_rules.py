"""migratory/server/publish_rules.py: what refuses a publish before it is taken (the
MaxSubjects bound here; the others are tested with each front end)."""

from __future__ import annotations

from test_mqtt_session import make, read, session

from migratory.model.message import Message
from migratory.protocol import mqtt, ops
from migratory.protocol.mqtt_encode import encode_packet
from migratory.server.publish_rules import check_publish


def test_new_subjects_past_max_subjects_are_refused() -> None:
    """A publisher inventing a subject per message (10,000 here): the server held every
    one of them (and, retained, for good). Past MaxSubjects a publish to a new subject
    is refused (PUBLISH_FAILED; MQTT: the connection closed); the subjects already held
    go on being published to."""
    ctx, held = make(MaxPublishesPerSecond="0", MaxSubjects="100")
    publisher = session(ctx, "pub", {})
    read(publisher)
    for chunk in range(100):  # (each chunk committed before the next is checked)
        publisher.receive_data(b"".join(
            encode_packet(mqtt.Publish(f"devices/d{i}/status", b"on", retain=True))
            for i in range(chunk * 100, chunk * 100 + 100)), 0.0)
        held.settle()
    assert ctx.hub.subject_count == 100
    assert publisher.closing  # MQTT 3.1.1 has no refusal: the connection is closed
    assert publisher.identity is not None
    status, reason = check_publish(ctx, publisher.listener, publisher.identity,
                                   Message("/devices/new/status", b"on"))
    assert status is ops.Status.PUBLISH_FAILED and reason is not None
    assert "MaxSubjects (100)" in reason
    assert check_publish(ctx, publisher.listener, publisher.identity,
                         Message("/devices/d7/status", b"off")) == (None, None)
    other = session(ctx, "pub2", {})
    other.receive_data(encode_packet(mqtt.Publish("devices/d7/status", b"off")), 0.0)
    held.settle()
    position = ctx.hub.position("/devices/d7/status")
    assert position is not None and position.seq == 2


def test_a_field_utf8_cannot_encode_is_refused_from_a_client_and_from_a_peer() -> None:
    """message_refusal is also a peer member's check (cluster/link_publishes.py): a field
    with a lone surrogate numbered by the seeds would raise in every member's hub."""
    from migratory.server.publish_rules import message_refusal

    for fields in ({"\ud800": "v"}, {"k": "\udfff"}, {"caf\xe9": "ok", "n": "x\ud800y"}):
        for member in (False, True):
            refusal = message_refusal(Message("/a/b", b"x", fields=fields), 1000, member=member)
            assert refusal is not None and refusal[0] is ops.Status.PUBLISH_FAILED
            assert "lone surrogate" in refusal[1]
    assert message_refusal(Message("/a/b", b"x", fields={"caf\xe9": "\u20ac"}), 1000) is None
