"""A valid publish followed by garbage in the same TCP segment, on every front end of
every member of a Guaranteed cluster, where a publish's outcome comes back from the
seeds only after the connection has already hit the garbage: the publish is
acknowledged exactly once before the connection closes (DESIGN: a publish with a
closure gets exactly one status back), never closed over in silence while the message
is published anyway."""

from __future__ import annotations

import json
import socket
import sys
from pathlib import Path

from cluster_fixture import LocalCluster

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "server"))
from mqttclient import MqttRawClient
from rawclient import RawClient

from migratory.model.message import Message
from migratory.protocol import close_codes, mqtt, mqtt_encode, ops
from migratory.protocol import websocket as ws

MQTT_OFFSET = 5
SUBJECT = "/Garbage/After"
GARBAGE = {  # what follows the publish, and the close code it earns (native WebSocket)
    "reserved-bits": (b"\xff\xff\xff\xff", close_codes.PROTOCOL_ERROR.code),
    "not-cbor": (ws.encode_masked_binary(b"\xff", b"abcd"), close_codes.INVALID_PAYLOAD.code),
}


def native_publish_then_garbage(port: int, closure: str, garbage: bytes) -> list[object]:
    """What the server answers, in order, to one segment: publish + garbage."""
    client = RawClient(port, timeout=20)
    client.connect("garbler")
    publish = ops.Publish(Message(SUBJECT, closure.encode(), closure=closure))
    client.send_raw(ws.encode_masked_binary(ops.encode_client_op(publish), b"abcd") + garbage)
    answers: list[object] = []
    while True:
        try:
            event = client.recv_event()
        except (ConnectionError, OSError):
            return answers
        if isinstance(event, ws.CloseReceived):
            return [*answers, event.code]
        assert isinstance(event, ws.BinaryMessage)
        answers.append(ops.decode_server_op(event.data))


def mqtt_publish_then_garbage(port: int, packet_id: int) -> list[object]:
    client = MqttRawClient(port, timeout=20)
    client.connect(f"garbler{packet_id}")
    publish = mqtt.Publish("Garbage/After", b"%d" % packet_id, qos=1, packet_id=packet_id)
    client.send_raw(mqtt_encode.encode_packet(publish) + b"\xf0\x00")  # reserved type 15
    answers: list[object] = []
    while True:
        try:
            answers.append(client.recv())
        except (ConnectionError, OSError):
            return answers


def http_publish_then_garbage(port: int, content: str) -> bytes:
    body = json.dumps({"subject": SUBJECT, "content": content}).encode()
    request = (b"POST /publish HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
               b"Content-Length: %d\r\n\r\n" % len(body)) + body
    with socket.create_connection(("127.0.0.1", port), timeout=20) as sock:
        sock.sendall(request + b"\x00GARBAGE\r\n\r\n")
        reply = b""
        while chunk := sock.recv(65536):
            reply += chunk
    return reply


def test_a_publish_then_garbage_in_one_segment_is_acknowledged_once(tmp_path: Path) -> None:
    cluster = LocalCluster(tmp_path, members=3)
    for i, settings in enumerate(cluster.settings):
        settings["ListenMqtt"] = f"127.0.0.1:{cluster.port(i) + MQTT_OFFSET}"
    cluster.start_all()
    try:
        cluster.wait_ready(timeout=60)
        closures = []
        for member in range(3):  # the Raft leader and its followers alike
            for name, (garbage, code) in GARBAGE.items():
                closure = f"{name}@{member}"
                closures.append(closure)
                answers = native_publish_then_garbage(cluster.port(member), closure, garbage)
                statuses = [a for a in answers if isinstance(a, ops.PublishStatus)]
                assert [(s.closure, s.status) for s in statuses] == [
                    (closure, ops.Status.PUBLISH_OK)], (closure, answers)
                assert answers[-1] == code, (closure, answers)  # the status first
            answers = mqtt_publish_then_garbage(cluster.port(member) + MQTT_OFFSET, member + 1)
            assert answers == [mqtt.Puback(member + 1)], (member, answers)
            reply = http_publish_then_garbage(cluster.port(member), f"http@{member}")
            assert reply.startswith(b"HTTP/1.1 200 "), reply
            assert reply.count(b"HTTP/1.1 ") == 2 and b"HTTP/1.1 400 " in reply, reply
        # each published once: the subject's history holds every one of them, once
        want = closures + [f"http@{m}" for m in range(3)] + ["1", "2", "3"]  # MQTT's too
        reader = RawClient(cluster.port(0), timeout=20)
        reader.connect("reader")
        reader.subscribe(SUBJECT, history=100)
        got: list[str] = []
        while len(got) < len(want):
            op = reader.recv_op()
            if isinstance(op, ops.Deliver):
                got += [m.content.decode() for m in op.messages]
        assert sorted(got) == sorted(want), got
    finally:
        cluster.stop()
