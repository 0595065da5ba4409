"""Malformed MQTT closes only the offending connection, counted and logged; a
bystander subscriber keeps receiving."""

from __future__ import annotations

import contextlib
import json
import socket
import urllib.request
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from mqttclient import MqttRawClient
from paho_client import PahoClient

from migratory.protocol import close_codes, mqtt, mqtt_encode
from migratory.protocol import websocket as ws
from migratory.protocol.http import handshake_request, new_websocket_key

CONNECT = mqtt_encode.encode_packet(mqtt.Connect("bad"))


def stats(port: int) -> dict[str, Any]:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/stats", timeout=5) as reply:
        result: dict[str, Any] = json.loads(reply.read())
        return result


@pytest.fixture
def served(start_server):  # type: ignore[no-untyped-def]
    """A server with an MQTT bystander subscribed and a publisher (one per test: a
    module-scoped one would need tests/conftest.py imported by name, which a full run
    resolves to another conftest)."""
    server = start_server(ListenMqtt="127.0.0.1:0", BatchTime="0", MaxFrameSize="200000",
                          MaxMessageSize="100000")
    bystander = PahoClient(server.mqtt_port, "bystander")
    bystander.subscribe("watch/this", 1)
    publisher = PahoClient(server.mqtt_port, "publisher")
    yield server, bystander, publisher
    bystander.stop()
    publisher.stop()


def still_served(served, content: bytes) -> None:  # type: ignore[no-untyped-def]
    _, bystander, publisher = served
    publisher.publish("watch/this", content, qos=1)
    assert [m.payload for m in bystander.receive(1)] == [content]


@pytest.mark.parametrize(
    ("bad", "logged"),
    [
        (mqtt_encode.encode_packet(mqtt.Pingreq()), "PINGREQ before CONNECT"),
        (CONNECT + b"\x30\xff\xff\xff\xff\x01", "remaining length longer than four bytes"),
        (CONNECT + b"\xc2\x00", "PINGREQ: reserved flags"),
        (CONNECT + b"\x82\x02\x00\x01", "SUBSCRIBE: no topic filter"),
        (CONNECT + b"\x30\xc0\x9a\x0c", "exceeds the limit of 200000"),  # 200,000+ bytes
        (CONNECT + CONNECT, "a second CONNECT"),
        (CONNECT + b"\x34\x05\x00\x01a\x00\x01", "QoS 2 is not supported"),
    ],
)
def test_malformed_packet_closes_only_its_connection(served, bad: bytes, logged: str) -> None:  # type: ignore[no-untyped-def]
    server = served[0]
    before = stats(server.port)["mqtt_protocol_errors"]
    client = MqttRawClient(server.mqtt_port)
    client.send_raw(bad)
    assert client.closed_by_server(), "the server must close a malformed connection"
    assert stats(server.port)["mqtt_protocol_errors"] == before + 1
    server.wait_logged("malformed MQTT, closing: ")
    server.wait_logged(logged)
    still_served(served, logged.encode())


@settings(max_examples=60, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(garbage=st.binary(min_size=1, max_size=400), before_connect=st.booleans())
def test_fuzz_garbage_never_hurts_the_bystander(served, garbage: bytes,  # type: ignore[no-untyped-def]
                                               before_connect: bool) -> None:
    server = served[0]
    with socket.create_connection(("127.0.0.1", server.mqtt_port), timeout=5) as sock:
        sock.sendall(garbage if before_connect else CONNECT + garbage)
        sock.shutdown(socket.SHUT_WR)
        sock.settimeout(5)
        try:
            while sock.recv(65536):
                pass
        except (ConnectionResetError, TimeoutError):
            pass
    still_served(served, garbage[:50] or b"-")


@pytest.mark.parametrize(
    ("frames", "logged"),
    [
        (ws.encode_frame(ws.TEXT, b"hello", mask=b"mask"), "MQTT travels in binary frames"),
        (ws.encode_masked_binary(b"\xc0\x00", b"mask"), "PINGREQ before CONNECT"),
        (bytes([0x82, 0x02]) + b"\x10\x00", "WebSocket: client frame is not masked"),
    ],
)
def test_malformed_mqtt_over_websocket_closes_only_its_connection(  # type: ignore[no-untyped-def]
    served, frames: bytes, logged: str
) -> None:
    server = served[0]
    with socket.create_connection(("127.0.0.1", server.port), timeout=5) as sock:
        key = new_websocket_key()
        sock.sendall(handshake_request("127.0.0.1", "/mqtt", key, subprotocol="mqtt"))
        head = b""
        while b"\r\n\r\n" not in head:
            head += sock.recv(4096)
        assert b"Sec-WebSocket-Protocol: mqtt" in head
        sock.sendall(frames)
        decoder = ws.FrameDecoder(client_frames=False)
        closed = None
        with contextlib.suppress(ConnectionResetError, TimeoutError):
            while (data := sock.recv(65536)):
                for event in decoder.events(data):
                    if isinstance(event, ws.CloseReceived):
                        closed = event
    assert closed is not None and closed.code == close_codes.PROTOCOL_ERROR.code
    server.wait_logged(logged)
    still_served(served, logged.encode())
