"""Entitlement = Token in a real Guaranteed cluster (3 seeds): a client that resumes a
subject after its member is killed, with a token that no longer grants the subject, is
refused on every member left (SUBSCRIBE_DENY, nothing recovered from the member's
replicated cache); the same resume with a token that grants it gets every message since
its position, then DATA_SYNC. An MQTT persistent session likewise: its filter is
dormant on a member where its new token lacks the right, and served on another once
the right is back."""

from __future__ import annotations

import sys
import time
from pathlib import Path

import jwt
from cluster_fixture import LocalCluster
from test_cluster_mqtt_resume import mqtt_port, with_mqtt

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "server"))
from mqttclient import MqttRawClient
from rawclient import RawClient, delivered

from migratory.model.message import Message
from migratory.model.position import Position
from migratory.protocol import mqtt, ops
from migratory.protocol import websocket as ws

SECRET = "k" * 40
SUBJECT = "/Secret/a"


def token(subscribe: list[str], publish: list[str] | None = None) -> str:
    claims = {"exp": int(time.time()) + 600, "subscribe": subscribe, "publish": publish or []}
    return jwt.encode(claims, SECRET, algorithm="HS256")


def connected(port: int, name: str, jwt_token: str) -> RawClient:
    """A client connected to the member on ``port``, trying again (at most 20 times)
    while it answers 1013 (not ready: its upstream or the leader just went away)."""
    for _ in range(20):
        client = RawClient(port, timeout=10)
        client.send_op(ops.Connect(client=name, token=jwt_token))
        event = client.recv_event()
        if not isinstance(event, ws.CloseReceived):
            assert isinstance(event, ws.BinaryMessage)
            assert isinstance(ops.decode_server_op(event.data), ops.Connected)
            return client
        client.close()
        time.sleep(0.5)
    raise AssertionError(f"the member on port {port} never took a connect")


def resumed(port: int, rights: list[str], since: Position) -> tuple[str, list[bytes]]:
    client = connected(port, "resumer", token(rights))
    try:
        client.subscribe(SUBJECT, position=since)
        answer = []
        while True:
            op = client.recv_op()
            answer.append(op)
            if isinstance(op, ops.SubjectStatus) and op.status in (
                    ops.Status.SUBSCRIBE_DENY, ops.Status.DATA_SYNC, ops.Status.DATA_RESYNC):
                return op.status.name, [m.content for m in delivered(answer)]
    finally:
        client.close()


def mqtt_resumed(port: int, jwt_token: str) -> list[tuple[str, bytes]]:
    """What the persistent session "dev" is sent when it comes back with ``jwt_token``:
    its resume's catch-up, all of it before the PINGRESP (handled in order), acknowledged."""
    for _ in range(20):  # a member not ready yet refuses the CONNECT (3)
        device = MqttRawClient(port, timeout=10)
        connack = device.connect("dev", clean_session=False, username="dev",
                                 password=jwt_token.encode())
        if connack.return_code == 0:
            break
        device.close()
        time.sleep(0.5)
    else:
        raise AssertionError(f"the member on port {port} never took the CONNECT")
    assert connack.session_present
    device.send(mqtt.Pingreq())
    got = []
    while not isinstance(packet := device.recv(), mqtt.Pingresp):
        assert isinstance(packet, mqtt.Publish), packet
        got.append((packet.topic, packet.payload))
        if packet.packet_id is not None:
            device.send(mqtt.Puback(packet.packet_id))
    device.send(mqtt.Disconnect())
    device.close()
    return got


def test_a_resume_without_the_right_is_refused_on_every_member_after_a_failover(
    tmp_path: Path,
) -> None:
    key = tmp_path / "secret"
    key.write_text(SECRET)
    cluster = LocalCluster(tmp_path, members=3, seeds=3, Entitlement="Token",
                           EntitlementTokenKeyFile=str(key))
    with_mqtt(cluster)
    cluster.start_all()
    try:
        cluster.wait_ready()
        both = token(["/Secret/**", "/Public/**"])
        device = MqttRawClient(mqtt_port(cluster, 0), timeout=10)
        assert device.connect("dev", clean_session=False, username="dev",
                              password=both.encode()).return_code == 0
        assert device.subscribe("Secret/a", "Public/a", qos=1).return_codes == (1, 1)
        device.send(mqtt.Disconnect())  # (the SUBACK came once the record was saved)
        device.close()
        publisher = connected(cluster.port(0), "publisher",
                              token([], ["/Secret/**", "/Public/**"]))
        statuses = [publisher.publish(Message(SUBJECT, b"%d" % i, closure=str(i)))
                    for i in range(4)]
        statuses.append(publisher.publish(Message("/Public/a", b"p", closure="p")))
        assert {s.status for s in statuses} == {ops.Status.PUBLISH_OK}
        publisher.close()
        since = statuses[0].position
        assert since is not None
        cluster.wait_same_applied(range(3))  # each member holds them: its resume says so
        cluster.kill(0)
        outcomes: dict[tuple[int, str], object] = {}
        for member in (1, 2):
            for name, rights in (("lost", ["/Public/**"]), ("kept", ["/Secret/**"])):
                outcomes[member, name] = resumed(cluster.port(member), rights, since)
        assert outcomes == {
            (member, name): (("SUBSCRIBE_DENY", []) if name == "lost"
                             else ("DATA_SYNC", [b"1", b"2", b"3"]))
            for member in (1, 2) for name in ("lost", "kept")
        }
        # the MQTT session, resumed on member 1 with a token without /Secret/**: its
        # Secret/a filter is dormant (nothing of it); then on member 2 with the right
        for member, rights, name in ((1, ["/Public/**"], "mqtt lost"), (2, None, "mqtt kept")):
            outcomes[member, name] = mqtt_resumed(mqtt_port(cluster, member),
                                                  token(rights) if rights else both)
        assert outcomes[1, "mqtt lost"] == [("Public/a", b"p")]
        kept = outcomes[2, "mqtt kept"]  # (Public/a again or not: at least once)
        assert isinstance(kept, list)
        assert [m for m in kept if m[0] == "Secret/a"] == [("Secret/a", b"%d" % i)
                                                            for i in range(4)]
    finally:
        cluster.stop()
