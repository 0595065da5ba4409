"""A Custom entitlement plugin that never answers, in a live server: the client it
blocks is denied (SUBSCRIBE_DENY), later uncached decisions are denied at once, and a
subscriber whose rights were decided before keeps receiving."""

from __future__ import annotations

import socket
import time
from pathlib import Path
from typing import Any

import pytest
from httpclient import SseClient
from mqttclient import MqttRawClient
from rawclient import RawClient

from migratory.model.message import Message
from migratory.protocol import mqtt, ops

STUCK_PLUGIN = '''
import time

class Rules:
    def __init__(self, options):
        pass

    def allow_connect(self, client):
        return True

    def allow_subscribe(self, client, subject):
        if subject.startswith("/Stuck/"):
            time.sleep(60)  # a rules service that never answers
        return True

    def allow_publish(self, client, subject):
        return True
'''


def test_a_stuck_plugin_denies_and_the_other_clients_carry_on(
    start_server: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "stuck_rules.py").write_text(STUCK_PLUGIN)
    monkeypatch.setenv("PYTHONPATH", str(tmp_path))
    server = start_server(BatchTime="0", Entitlement="Custom",
                          EntitlementPlugin="stuck_rules:Rules", EntitlementPluginTimeout="100")
    reader, publisher, victim = (RawClient(server.port) for _ in range(3))
    reader.connect("reader")
    reader.subscribe("/a/b")
    reader.recv_ops_until_status(ops.Status.SUBSCRIBE_ALLOW)
    publisher.connect("publisher")
    first = publisher.publish(Message("/a/b", b"0", closure="0"))  # decided, cached
    assert first.status is ops.Status.PUBLISH_OK
    victim.connect("victim")
    victim.subscribe("/Stuck/x")
    denied = victim.recv_ops_until_status(ops.Status.SUBSCRIBE_DENY)[-1]
    victim.subscribe("/a/c")  # asked while the plugin is stuck: denied at once
    denied_too = victim.recv_ops_until_status(ops.Status.SUBSCRIBE_DENY)[-1]
    assert isinstance(denied, ops.SubjectStatus) and denied.subject == "/Stuck/x"
    assert isinstance(denied_too, ops.SubjectStatus) and denied_too.subject == "/a/c"
    for i in range(1, 21):
        assert publisher.publish(Message("/a/b", b"%d" % i, closure=str(i))).status is (
            ops.Status.PUBLISH_OK)
    got = [m.content for m in reader.recv_messages(21)]
    assert got == [b"%d" % i for i in range(21)]
    for client in (reader, publisher, victim):
        client.close()
    assert "stuck_rules:Rules" in server.log() and "EntitlementPluginTimeout" in server.log()


HELD_PLUGIN = '''
import os
import time

class Rules:
    def __init__(self, options):
        self.folder = options

    def allow_connect(self, client):
        return True

    def allow_subscribe(self, client, subject):
        if subject.startswith("/Held/"):
            self.hold()
        return True

    def allow_publish(self, client, subject):
        if subject.startswith("/HeldWill/"):
            self.hold()
        return True

    def hold(self):
        open(os.path.join(self.folder, "asked"), "w").close()
        for _ in range(300):  # held until the test releases it (15 s at most)
            if os.path.exists(os.path.join(self.folder, "release")):
                break
            time.sleep(0.05)
'''


def wait_for_file(path: Path) -> None:
    for _ in range(200):
        if path.exists():
            return
        time.sleep(0.05)
    raise AssertionError(f"{path.name} never appeared")


def held_server(start_server: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Any:
    (tmp_path / "held_rules.py").write_text(HELD_PLUGIN)
    monkeypatch.setenv("PYTHONPATH", str(tmp_path))
    return start_server(BatchTime="0", Entitlement="Custom", ListenMqtt="127.0.0.1:0",
                        EntitlementPlugin="held_rules:Rules",
                        EntitlementPluginOptions=str(tmp_path),
                        EntitlementPluginTimeout="10000")


def bystanders(port: int) -> tuple[RawClient, RawClient]:
    """A reader of /a/b and a publisher, connected before the plugin is held."""
    reader, publisher = RawClient(port), RawClient(port)
    reader.connect("reader")
    publisher.connect("publisher")
    reader.subscribe("/a/b")
    reader.recv_ops_until_status(ops.Status.SUBSCRIBE_ALLOW)
    return reader, publisher


def test_a_plugin_call_under_way_holds_its_own_client_and_nobody_else(
    start_server: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The event loop does not wait for the plugin: while one client's subscribe is being
    decided (the plugin held, well within EntitlementPluginTimeout), the others publish
    and receive; that client's own later operations wait for the decision, in order."""
    server = held_server(start_server, tmp_path, monkeypatch)
    reader, publisher, victim = (RawClient(server.port) for _ in range(3))
    for name, client in (("reader", reader), ("publisher", publisher), ("victim", victim)):
        client.connect(name)
    reader.subscribe("/a/b")
    reader.recv_ops_until_status(ops.Status.SUBSCRIBE_ALLOW)
    assert publisher.publish(Message("/a/b", b"0", closure="0")).status is ops.Status.PUBLISH_OK
    victim.subscribe("/Held/x")
    victim.send_op(ops.Ping(7))  # read only once /Held/x is decided
    victim.send_op(ops.Publish(Message("/a/b", b"v", closure="v")))  # then asked, in turn
    wait_for_file(tmp_path / "asked")
    newcomer = RawClient(server.port)
    newcomer.send_op(ops.Connect(client="newcomer"))  # asked after /Held/x: waits for it
    # the plugin is held: before, so was every client (the loop waited up to 10 s), and
    # this publish was not answered within the client's 5 s
    for i in range(1, 11):
        status = publisher.publish(Message("/a/b", b"%d" % i, closure=str(i)))
        assert status.status is ops.Status.PUBLISH_OK
    assert [m.content for m in reader.recv_messages(11)] == [b"%d" % i for i in range(11)]
    assert not (tmp_path / "release").exists()
    (tmp_path / "release").touch()
    answer = [victim.recv_op(), victim.recv_op(), victim.recv_op()]
    assert isinstance(answer[0], ops.SubjectStatus)
    assert (answer[0].status, answer[0].subject) == (ops.Status.SUBSCRIBE_ALLOW, "/Held/x")
    assert answer[1] == ops.Pong(7)
    assert isinstance(answer[2], ops.PublishStatus)
    assert (answer[2].status, answer[2].closure) == (ops.Status.PUBLISH_OK, "v")
    assert isinstance(newcomer.recv_op(), ops.Connected)
    assert [m.content for m in reader.recv_messages(1)] == [b"v"]
    for client in (reader, publisher, victim, newcomer):
        client.close()


def test_a_plugin_call_under_way_holds_its_own_mqtt_client_and_nobody_else(
    start_server: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The same over MQTT: the plugin held on one client's SUBSCRIBE holds that client
    (its PINGREQ and PUBLISH are answered after the SUBACK, in order) and a CONNECT asked
    after it, not the others."""
    server = held_server(start_server, tmp_path, monkeypatch)
    reader, publisher = bystanders(server.port)
    # decided (cached) before the plugin is held: one call at a time in its thread
    assert publisher.publish(Message("/a/b", b"0", closure="0")).status is ops.Status.PUBLISH_OK
    victim = MqttRawClient(server.mqtt_port)
    assert victim.connect("victim").return_code == 0
    victim.send(mqtt.Subscribe(1, (("Held/x", 0),)))
    victim.send(mqtt.Pingreq())
    victim.send(mqtt.Publish("a/b", b"m", qos=1, packet_id=2))
    wait_for_file(tmp_path / "asked")
    newcomer = MqttRawClient(server.mqtt_port)
    newcomer.send(mqtt.Connect("newcomer"))
    for i in range(1, 11):  # before: the loop waited for the plugin, these timed out
        status = publisher.publish(Message("/a/b", b"%d" % i, closure=str(i)))
        assert status.status is ops.Status.PUBLISH_OK
    assert [m.content for m in reader.recv_messages(11)] == [b"%d" % i for i in range(11)]
    (tmp_path / "release").touch()
    assert [victim.recv(), victim.recv(), victim.recv()] == [
        mqtt.Suback(1, (0,)), mqtt.Pingresp(), mqtt.Puback(2)]
    assert newcomer.recv() == mqtt.Connack(False, 0)
    assert [m.content for m in reader.recv_messages(1)] == [b"m"]
    for client in (reader, publisher):
        client.close()
    victim.close()
    newcomer.close()


def test_an_invalid_filter_first_in_a_subscribe_does_not_hold_the_others(
    start_server: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A SUBSCRIBE whose first filter is invalid (0x80) and whose next one the plugin
    holds: the next is asked ahead too, so the loop does not wait for the plugin. Before,
    the first invalid filter ended the asking ahead, and the SUBSCRIBE asked the next in
    the event loop: every client waited for the plugin (here 10 s, the timeout)."""
    server = held_server(start_server, tmp_path, monkeypatch)
    reader, publisher = bystanders(server.port)
    assert publisher.publish(Message("/a/b", b"0", closure="0")).status is ops.Status.PUBLISH_OK
    victim = MqttRawClient(server.mqtt_port)
    assert victim.connect("victim").return_code == 0
    victim.send(mqtt.Subscribe(1, (("bad", 0), ("Held/x", 0), ("a//b", 0))))
    wait_for_file(tmp_path / "asked")
    status = publisher.publish(Message("/a/b", b"1", closure="1"))  # (5 s: RawClient's)
    assert status.status is ops.Status.PUBLISH_OK
    assert [m.content for m in reader.recv_messages(2)] == [b"0", b"1"]
    (tmp_path / "release").touch()
    assert victim.recv() == mqtt.Suback(1, (0x80, 0, 0x80))
    for client in (reader, publisher):
        client.close()
    victim.close()


def test_a_plugin_call_under_way_holds_its_own_http_request_and_nobody_else(
    start_server: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The same over HTTP: the plugin held on a GET /snapshot holds that request (and an
    SSE stream asked after it, queued behind it in the plugin's thread), not the
    others; both are answered once it is decided."""
    server = held_server(start_server, tmp_path, monkeypatch)
    reader, publisher = bystanders(server.port)
    for subject in ("/a/b", "/Held/x"):
        retained = Message(subject, b"r", retained=True, closure="r")
        assert publisher.publish(retained).status is ops.Status.PUBLISH_OK
    getter = socket.create_connection(("127.0.0.1", server.port), timeout=5)
    getter.sendall(b"GET /snapshot?subject=/Held/x HTTP/1.1\r\nHost: localhost\r\n\r\n")
    wait_for_file(tmp_path / "asked")
    stream = SseClient(server.port, ["/Held/y"])
    for i in range(1, 11):  # before: the loop waited for the plugin, these timed out
        status = publisher.publish(Message("/a/b", b"%d" % i, closure=str(i)))
        assert status.status is ops.Status.PUBLISH_OK
    assert [m.content for m in reader.recv_messages(11)] == [b"r"] + [b"%d" % i
                                                                    for i in range(1, 11)]
    (tmp_path / "release").touch()
    assert getter.recv(65536).startswith(b"HTTP/1.1 200 ")
    assert stream.wait_head() == 200
    event = stream.next_event()
    assert event is not None and event["event"] == "subscribe"
    getter.close()
    stream.sock.close()
    for client in (reader, publisher):
        client.close()


def test_a_resumed_mqtt_sessions_stored_filters_are_asked_without_holding_the_others(
    start_server: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A persistent session's CONNECT asks the plugin about each filter it stored (a new
    connection: another peer, nothing cached): the plugin held on one, that CONNECT
    waits for it, not the others; then the session is resumed (session present)."""
    server = held_server(start_server, tmp_path, monkeypatch)
    reader, publisher = bystanders(server.port)
    (tmp_path / "release").touch()  # first the session is made, the plugin answering
    assert publisher.publish(Message("/a/b", b"0", closure="0")).status is ops.Status.PUBLISH_OK
    device = MqttRawClient(server.mqtt_port)
    assert device.connect("dev", clean_session=False).return_code == 0
    assert device.subscribe("Held/x", qos=1).return_codes == (1,)  # saved: then SUBACK
    device.send(mqtt.Disconnect())
    assert device.closed_by_server()
    device.close()
    for name in ("release", "asked"):
        (tmp_path / name).unlink()
    device = MqttRawClient(server.mqtt_port)
    device.send(mqtt.Connect("dev", clean_session=False))
    wait_for_file(tmp_path / "asked")
    for i in range(1, 11):  # before: the loop waited for the plugin, these timed out
        status = publisher.publish(Message("/a/b", b"%d" % i, closure=str(i)))
        assert status.status is ops.Status.PUBLISH_OK
    assert [m.content for m in reader.recv_messages(11)] == [b"%d" % i for i in range(11)]
    (tmp_path / "release").touch()
    assert device.recv() == mqtt.Connack(True, 0)
    device.close()
    for client in (reader, publisher):
        client.close()


def test_an_mqtt_will_is_asked_at_connect_without_holding_the_others(
    start_server: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The will's publish right is asked with the CONNECT (ahead, the CONNECT waiting for
    it), not when the connection is lost -- there it held the event loop, as nothing is
    left to hold back; the will is then published from the decision cached."""
    server = held_server(start_server, tmp_path, monkeypatch)
    reader, publisher = bystanders(server.port)
    assert publisher.publish(Message("/a/b", b"0", closure="0")).status is ops.Status.PUBLISH_OK
    heir = RawClient(server.port)
    heir.connect("heir")
    heir.subscribe("/HeldWill/x")
    heir.recv_ops_until_status(ops.Status.SUBSCRIBE_ALLOW)
    device = MqttRawClient(server.mqtt_port)
    device.send(mqtt.Connect("dev", will=mqtt.Will("HeldWill/x", b"gone", 0, False)))
    wait_for_file(tmp_path / "asked")  # before: not asked until the connection was lost
    for i in range(1, 11):
        status = publisher.publish(Message("/a/b", b"%d" % i, closure=str(i)))
        assert status.status is ops.Status.PUBLISH_OK
    assert [m.content for m in reader.recv_messages(11)] == [b"%d" % i for i in range(11)]
    (tmp_path / "release").touch()
    assert device.recv() == mqtt.Connack(False, 0)
    device.close()  # lost without DISCONNECT: the will
    assert [m.content for m in heir.recv_messages(1)] == [b"gone"]
    for client in (reader, publisher, heir):
        client.close()
