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
from migratory.protocol import ops
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
    **{name: REFUSED for name in ("garbage", "alg none", "other key", "not yet valid")},
    "expired": {**REFUSED, "native": 4503},
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
    for name, token in tokens().items():
        published, snapshot = http(server.port, token)
        got[name] = {"native": native(server.port, token),
                     "mqtt": over_mqtt(server.mqtt_port, token),
                     "sse": sse(server.port, token), "publish": published,
                     "snapshot": snapshot}
    assert got == EXPECTED
