"""The publisher's pre-encoded wire: every message decodes, with the server's own decoders,
to the publish it stands for (subject round-robin, stamp, closure / packet id), and the
acknowledgement reader finds every PUBLISH_OK and routes anything else through decoding."""

from __future__ import annotations

import re

import cbor2
import pytest

from migratory.bench.publish_wire import mqtt_wire, native_wire
from migratory.bench.stamp import MARK, STAMP
from migratory.model.position import Position
from migratory.protocol import mqtt, mqtt_encode, ops
from migratory.protocol.websocket import (
    BinaryMessage,
    FrameDecoder,
    encode_binary,
    encode_close,
)

SUBJECTS = 7
SIZE = 100


def decoded_publishes(stream: bytes) -> list[dict[str, object]]:
    out = []
    for event in FrameDecoder(client_frames=True).events(stream):
        assert isinstance(event, BinaryMessage), event
        out.append(cbor2.loads(event.data))
    return out


@pytest.mark.parametrize("ack", [True, False])
def test_native_messages_decode_to_their_publishes(ack: bool) -> None:
    encode, _ = native_wire(SUBJECTS, ack, SIZE)
    out = bytearray()
    stamps = [10**18 + 7919 * i for i in range(25)]
    keys = [encode(out, i, stamps[i]) for i in range(25)]
    publishes = decoded_publishes(bytes(out))
    assert [p["subject"] for p in publishes] == [
        f"/bench/fanout/{i % SUBJECTS}" for i in range(25)]
    for i, p in enumerate(publishes):
        content = p["content"]
        assert isinstance(content, bytes) and len(content) == SIZE
        assert STAMP.findall(content) == [b"%019d" % stamps[i]]
        assert content.startswith(MARK)
        assert p.get("closure") == (f"{i:010d}" if ack else None)
    assert keys == (list(range(25)) if ack else [None] * 25)


def test_mqtt_messages_decode_to_their_publishes() -> None:
    encode, _ = mqtt_wire(SUBJECTS, True, SIZE)
    out = bytearray()
    for i in range(70_000, 70_020):
        encode(out, i, 10**18 + i)
    connect = mqtt_encode.encode_packet(mqtt.Connect("bench-publisher", keep_alive=0))
    _connect, *packets = mqtt.MqttDecoder(server=True).events(connect + bytes(out))
    assert [p.topic for p in packets] == [  # type: ignore[attr-defined]
        f"bench/fanout/{i % SUBJECTS}" for i in range(70_000, 70_020)]
    assert [p.packet_id for p in packets] == [  # type: ignore[attr-defined]
        i % 65535 + 1 for i in range(70_000, 70_020)]
    assert [STAMP.findall(p.payload) for p in packets] == [  # type: ignore[attr-defined]
        [b"%019d" % (10**18 + i)] for i in range(70_000, 70_020)]


def status_frame(status: ops.Status, closure: str, reason: str | None = None) -> bytes:
    op = ops.PublishStatus(status, closure, "/bench/fanout/3", Position(2**40, 77), reason)
    return encode_binary(ops.encode_server_op(op))


def test_acknowledgements_are_found_and_failures_decoded() -> None:
    _, replies = native_wire(SUBJECTS, True, SIZE)
    ok = [status_frame(ops.Status.PUBLISH_OK, f"{i:010d}") for i in range(50)]
    stream = b"".join(ok)
    found, rest = replies(stream[:-3])  # the last frame incomplete: kept for the next chunk
    assert found == [("PUBLISH_OK", i) for i in range(49)] and rest == stream[-len(ok[-1]):-3]
    failed = status_frame(ops.Status.PUBLISH_FAILED, f"{50:010d}", "no quorum")
    found, rest = replies(ok[0] + failed + encode_close(1001, "bye"))
    assert found == [("PUBLISH_OK", 0), ("PUBLISH_FAILED: no quorum", 50),
                     ("close frame 1001", None)] and rest == b""


def test_the_fast_path_agrees_with_decoding() -> None:
    """The regex is the decoding's shortcut: a stream whose closures the regex would read
    wrongly must not take it (planted: a status whose closure is not ten digits)."""
    _, replies = native_wire(SUBJECTS, True, SIZE)
    odd = status_frame(ops.Status.PUBLISH_OK, "abc")
    found, _ = replies(odd + status_frame(ops.Status.PUBLISH_OK, f"{4:010d}"))
    assert found == [("PUBLISH_OK", "abc"), ("PUBLISH_OK", 4)]
    assert re.search(rb"closure", odd)
