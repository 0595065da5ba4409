"""The same token gets the same answer on every front end (Entitlement = Token, a live
server): garbage, `alg: none`, another key, expired, not yet valid, valid without the
right, valid with it -- over the native protocol, MQTT, Server-Sent Events, POST
/publish and GET /snapshot. Each denial is a status or a close code, never silence."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import jwt
from httpclient import HttpClient, SseClient
from mqttclient import MqttRawClient
from rawclient import RawClient

from migratory.model.message import Message
from migratory.protocol import mqtt, ops
from migratory.protocol import websocket as ws

SECRET = "k" * 40


def jwt_token(now: int, key: str = SECRET, algorithm: str = "HS256", **claims: Any) -> str:
    body = {"exp": now + 600, "subscribe": ["/T/**"], "publish": ["/T/**"], **claims}
    return jwt.encode(body, key if algorithm != "none" else None, algorithm=algorithm)


def tokens() -> dict[str, str]:
    """Made when the test runs: made at import, the valid ones had expired by the time
    a full run (over 10 minutes) reached the test."""
    now = int(time.time())
    return {
        "garbage": "not.a.jwt",
        "alg none": jwt_token(now, algorithm="none"),
        "other key": jwt_token(now, key="o" * 40),
        "expired": jwt_token(now, exp=now - 5),
        "not yet valid": jwt_token(now, nbf=now + 3600),
        "no right": jwt_token(now, subscribe=["/Other/**"], publish=["/Other/**"]),
        "right": jwt_token(now),
    }
REFUSED = {"native": 4003, "mqtt": 5, "sse": 403, "publish": 403, "snapshot": 403}
EXPECTED = {
    **{name: REFUSED for name in ("garbage", "alg none", "other key")},
    "expired": {**REFUSED, "native": 4503},
    "not yet valid": {**REFUSED, "native": 4504},  # was 4003: ended SDK clients for good
    "no right": {"native": ("SUBSCRIBE_DENY", "PUBLISH_DENIED"), "mqtt": (0, 0x80),
                 "sse": (200, "deny"), "publish": 403, "snapshot": 403},
    "right": {"native": ("SUBSCRIBE_ALLOW", "PUBLISH_OK"), "mqtt": (0, 0),
              "sse": (200, "subscribe"), "publish": 200, "snapshot": 200},
}


def native(port: int, token: str) -> Any:
    client = RawClient(port)
    try:
        client.send_op(ops.Connect(client="n", token=token))
        event = client.recv_event()
        if isinstance(event, ws.CloseReceived):
            return event.code
        assert isinstance(ops.decode_server_op(event.data), ops.Connected)  # type: ignore[union-attr]
        client.subscribe("/T/a")
        subscribed = next(op.status.name for op in iter(client.recv_op, None)
                          if isinstance(op, ops.SubjectStatus))
        client.send_op(ops.Publish(Message("/T/a", b"n", closure="1")))
        published = next(op.status.name for op in iter(client.recv_op, None)
                         if isinstance(op, ops.PublishStatus))
        return subscribed, published
    finally:
        client.close()


def over_mqtt(port: int, token: str) -> Any:
    client = MqttRawClient(port)
    try:
        connack = client.connect("m", username="m", password=token.encode())
        if connack.return_code:
            return connack.return_code
        suback = client.subscribe("T/a")
        return connack.return_code, suback.return_codes[0]
    finally:
        client.close()


def sse(port: int, token: str) -> Any:
    stream = SseClient(port, ["/T/a"], extra=f"&token={token}")
    try:
        status = stream.wait_head()
        if status != 200:
            return status
        event = stream.next_event()
        assert event is not None
        return status, event["event"]
    finally:
        stream.sock.close()


def http(port: int, token: str) -> tuple[int, int]:
    client = HttpClient(port)
    try:
        published, _ = client.publish(subject="/T/b", content="h", token=token, retained=True)
        response, _ = client.request("GET", f"/snapshot?subject=/T/b&token={token}")
        return published, response.status_code
    finally:
        client.close()


def test_the_same_token_gets_the_same_answer_on_every_front_end(
    start_server: Any, tmp_path: Path
) -> None:
    key = tmp_path / "secret"
    key.write_text(SECRET)
    server = start_server(BatchTime="0", Entitlement="Token", EntitlementTokenKeyFile=str(key),
                          ListenMqtt="127.0.0.1:0")
    got = {}
    made = tokens()
    for name, token in made.items():
        published, snapshot = http(server.port, token)
        got[name] = {"native": native(server.port, token),
                     "mqtt": over_mqtt(server.mqtt_port, token),
                     "sse": sse(server.port, token), "publish": published,
                     "snapshot": snapshot}
    assert got == EXPECTED
    # a token not valid yet: SSE's 403 and MQTT's close name why (nbf, the clocks)
    client = HttpClient(server.port)
    try:
        early = made["not yet valid"]
        response, body = client.request("GET", f"/events?subject=/T/a&token={early}")
        assert response.status_code == 403 and b"not valid before (nbf)" in body, body
        _, metrics = client.request("GET", "/metrics")
    finally:
        client.close()
    closed = b'migratory_connections_closed_total{reason="TOKEN_NOT_YET_VALID"} 2'
    assert closed in metrics  # the native session and the MQTT connection


def test_a_right_to_publish_is_not_a_right_to_subscribe_nor_the_other_way_on_any_front(
    start_server: Any, tmp_path: Path
) -> None:
    """One token: subscribe under /S, publish under /P. Each right is asked for its own
    action on every front end: subscribing to /P and publishing to /S are refused
    (native, MQTT -- a PUBLISH it may not make closes the connection, MQTT 3.1.1 having
    no negative acknowledgement --, SSE, POST /publish, GET /snapshot)."""
    key = tmp_path / "secret"
    key.write_text(SECRET)
    server = start_server(BatchTime="0", Entitlement="Token", EntitlementTokenKeyFile=str(key),
                          ListenMqtt="127.0.0.1:0")
    mixed = jwt_token(int(time.time()), subscribe=["/S/**"], publish=["/P/**"])
    got: dict[str, Any] = {}
    client = RawClient(server.port)
    client.connect("n", token=mixed)
    for subject in ("/P/a", "/S/a"):
        client.subscribe(subject)
        got["native subscribe " + subject] = next(
            op.status.name for op in iter(client.recv_op, None)
            if isinstance(op, ops.SubjectStatus))
    for subject in ("/S/a", "/P/a"):
        got["native publish " + subject] = client.publish(
            Message(subject, b"n", closure="1")).status.name
    client.close()
    mqtt_client = MqttRawClient(server.mqtt_port)
    assert mqtt_client.connect("m", username="m", password=mixed.encode()).return_code == 0
    got["mqtt subscribe"] = mqtt_client.subscribe("P/a", "S/a", "P/#", "#").return_codes
    mqtt_client.send(mqtt.Publish("P/a", b"m", qos=1, packet_id=7))
    got["mqtt publish P/a"] = type(mqtt_client.recv()).__name__
    mqtt_client.send(mqtt.Publish("S/a", b"m", qos=1, packet_id=8))
    got["mqtt publish S/a closed"] = mqtt_client.closed_by_server()
    mqtt_client.close()
    for subject in ("/P/a", "/S/a"):
        got["sse " + subject] = sse_of(server.port, subject, mixed)
    http_client = HttpClient(server.port)
    for subject in ("/S/b", "/P/b"):
        got["http publish " + subject] = http_client.publish(
            subject=subject, content="h", token=mixed, retained=True)[0]
    other = jwt_token(int(time.time()), publish=["/S/**"])  # a snapshot for /S/b
    assert http_client.publish(subject="/S/b", content="o", token=other, retained=True)[0] == 200
    for subject in ("/P/b", "/S/b"):
        got["snapshot " + subject] = http_client.request(
            "GET", f"/snapshot?subject={subject}&token={mixed}")[0].status_code
    http_client.close()
    assert got == {
        "native subscribe /P/a": "SUBSCRIBE_DENY", "native subscribe /S/a": "SUBSCRIBE_ALLOW",
        "native publish /S/a": "PUBLISH_DENIED", "native publish /P/a": "PUBLISH_OK",
        "mqtt subscribe": (0x80, 0, 0x80, 0x80), "mqtt publish P/a": "Puback",
        "mqtt publish S/a closed": True,
        "sse /P/a": (200, "deny"), "sse /S/a": (200, "subscribe"),
        "http publish /S/b": 403, "http publish /P/b": 200,
        "snapshot /P/b": 403, "snapshot /S/b": 200,
    }


def sse_of(port: int, subject: str, token: str) -> Any:
    stream = SseClient(port, [subject], extra=f"&token={token}")
    try:
        status = stream.wait_head()
        event = stream.next_event() if status == 200 else None
        return status if event is None else (status, event["event"])
    finally:
        stream.sock.close()
