"""MQTT 3.1.1 against a real server process, with paho-mqtt and mosquitto's clients."""

from __future__ import annotations

import shutil
import subprocess
import time
import urllib.error
import urllib.request

import pytest
from mqttclient import MqttRawClient, stats, wait_subscriptions
from paho_client import PahoClient
from rawclient import RawClient

from migratory.model.message import Message
from migratory.protocol import mqtt, ops


@pytest.fixture
def server(start_server):  # type: ignore[no-untyped-def]
    return start_server(ListenMqtt="127.0.0.1:0", BatchTime="0")


def test_publish_subscribe_with_wildcards_and_qos(server) -> None:  # type: ignore[no-untyped-def]
    subscriber = PahoClient(server.mqtt_port, "sub")
    assert subscriber.subscribe("sensors/+/temp", 1) == [1]
    assert subscriber.subscribe("alerts/#", 0) == [0]
    assert subscriber.subscribe("exact/one", 2) == [1]  # QoS 2 is granted as 1
    publisher = PahoClient(server.mqtt_port, "pub")
    publisher.publish("sensors/kitchen/temp", b"21.5", qos=1)
    publisher.publish("sensors/kitchen/humidity", b"40", qos=1)  # matches nothing
    publisher.publish("alerts/fire/floor2", b"!", qos=0)
    publisher.publish("exact/one", b"1", qos=1)
    got = subscriber.receive(3)
    assert [(m.topic, m.payload, m.qos, m.retain) for m in got] == [
        ("sensors/kitchen/temp", b"21.5", 1, False),
        ("alerts/fire/floor2", b"!", 0, False),
        ("exact/one", b"1", 1, False),
    ]
    assert subscriber.nothing_more()
    publisher.stop()
    subscriber.stop()


def test_pubacks_come_in_the_order_of_the_publishes(server) -> None:  # type: ignore[no-untyped-def]
    """MQTT 3.1.1 section 4.6, 2,000 QoS 1 PUBLISHes over 200 subjects in one write (the
    Guaranteed cluster's: test_cluster_mqtt_resume.py)."""
    client = MqttRawClient(server.mqtt_port)
    client.connect("burst")
    assert client.publish_burst(2000, subjects=200) == [n + 1 for n in range(2000)]
    client.close()


def test_overlapping_filters_deliver_once(server) -> None:  # type: ignore[no-untyped-def]
    subscriber = PahoClient(server.mqtt_port, "overlap")
    subscriber.subscribe("a/+", 1)
    subscriber.subscribe("a/#", 1)
    subscriber.subscribe("a/b", 1)
    PahoClient(server.mqtt_port, "p").publish("a/b", b"once", qos=1)
    assert [m.payload for m in subscriber.receive(1)] == [b"once"]
    assert subscriber.nothing_more()


def test_retained_message_is_the_snapshot(server) -> None:  # type: ignore[no-untyped-def]
    publisher = PahoClient(server.mqtt_port, "pub")
    publisher.publish("home/door", b"open", qos=1, retain=True)
    publisher.publish("home/door", b"closed", qos=1, retain=True)
    publisher.publish("home/door", b"not retained", qos=1)
    late = PahoClient(server.mqtt_port, "late")
    late.subscribe("home/#", 1)
    (message,) = late.receive(1)
    assert (message.payload, message.retain) == (b"closed", True)
    # the native protocol sees the same snapshot
    native = RawClient(server.port)
    native.connect("native")
    native.subscribe("/home/door")
    allow = native.recv_op()
    assert isinstance(allow, ops.SubjectStatus) and allow.status is ops.Status.SUBSCRIBE_ALLOW
    (snapshot,) = native.recv_messages(1)
    assert (snapshot.content, snapshot.seq) == (b"closed", 2)
    # an empty retained payload removes it for MQTT subscribers
    publisher.publish("home/door", b"", qos=1, retain=True)
    later = PahoClient(server.mqtt_port, "later")
    later.subscribe("home/door", 1)
    assert later.nothing_more()


def test_cross_protocol_delivery(server) -> None:  # type: ignore[no-untyped-def]
    mqtt_sub = PahoClient(server.mqtt_port, "mqtt-sub")
    mqtt_sub.subscribe("Stocks/NYSE/+", 0)
    native_sub = RawClient(server.port)
    native_sub.connect("native-sub")
    native_sub.subscribe("/Stocks/NYSE/IBM")
    native_sub.recv_op()  # SUBSCRIBE_ALLOW
    # MQTT -> native and MQTT
    PahoClient(server.mqtt_port, "mqtt-pub").publish("Stocks/NYSE/IBM", b"from mqtt", qos=1)
    (native_got,) = native_sub.recv_messages(1)
    assert (native_got.subject, native_got.content) == ("/Stocks/NYSE/IBM", b"from mqtt")
    assert native_got.seq == 1
    # native -> MQTT and native
    native_pub = RawClient(server.port)
    native_pub.connect("native-pub")
    status = native_pub.publish(Message("/Stocks/NYSE/IBM", b"from native", closure="c1"))
    assert status.status is ops.Status.PUBLISH_OK and status.position is not None
    assert status.position.seq == 2
    (second,) = native_sub.recv_messages(1)
    assert second.content == b"from native"
    assert [m.payload for m in mqtt_sub.receive(2)] == [b"from mqtt", b"from native"]


def test_mosquitto_clients_publish_and_subscribe(server) -> None:  # type: ignore[no-untyped-def]
    for tool in ("mosquitto_sub", "mosquitto_pub"):
        assert shutil.which(tool), f"{tool} missing: `make test` installs mosquitto-clients"
    port = str(server.mqtt_port)
    sub = subprocess.Popen(
        ["mosquitto_sub", "-h", "127.0.0.1", "-p", port, "-t", "demo/+", "-q", "1",
         "-C", "2", "-v", "-W", "20"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE,
    )
    try:
        wait_subscriptions(server.port, 1)
        for text in ("one", "two"):
            subprocess.run(
                ["mosquitto_pub", "-h", "127.0.0.1", "-p", port, "-t", "demo/x", "-q", "1",
                 "-m", text], check=True, timeout=10,
            )
        out, err = sub.communicate(timeout=15)
    finally:
        if sub.poll() is None:
            sub.kill()
            sub.wait()
    assert sub.returncode == 0, err
    assert out.decode().splitlines() == ["demo/x one", "demo/x two"]


def test_entitlement_gets_username_and_password(start_server) -> None:  # type: ignore[no-untyped-def]
    server = start_server(ListenMqtt="127.0.0.1:0", Entitlement="Basic",
                          EntitlementAllowToken="s3cret")
    subscriber = PahoClient(server.mqtt_port, "anyone")
    subscriber.subscribe("news/today", 1)
    allowed = PahoClient(server.mqtt_port, "editor", username="editor", password="s3cret")
    allowed.publish("news/today", b"allowed", qos=1)
    refused = MqttRawClient(server.mqtt_port)
    refused.connect("intruder", username="intruder", password=b"wrong")
    refused.send(mqtt.Publish("news/today", b"forged", qos=1, packet_id=1))
    assert refused.closed_by_server(), "a refused publish closes the connection"
    assert [m.payload for m in subscriber.receive(1)] == [b"allowed"]
    assert subscriber.nothing_more()
    assert stats(server.port)["publishes_refused"] == 1


def test_will_on_a_dropped_connection_not_on_disconnect(server) -> None:  # type: ignore[no-untyped-def]
    watcher = PahoClient(server.mqtt_port, "watcher")
    watcher.subscribe("status/+", 1)
    polite = PahoClient(server.mqtt_port, "polite", will=("status/polite", b"gone", 1, False))
    polite.stop()
    dropped = PahoClient(server.mqtt_port, "dropped", will=("status/dropped", b"lost", 1, True))
    dropped.drop()
    (will,) = watcher.receive(1)
    assert (will.topic, will.payload) == ("status/dropped", b"lost")
    assert watcher.nothing_more()
    assert stats(server.port)["mqtt_wills_published"] == 1


def test_a_dropped_mqtt_over_websocket_connection_publishes_its_will_and_unsubscribes(
    server,  # type: ignore[no-untyped-def]
) -> None:
    """The connection upgraded to MQTT by WebSocket subprotocol: when it drops, the MQTT
    session (not the WebSocket session it replaced) is told -- its will is published and
    its subscription leaves the hub."""
    watcher = PahoClient(server.mqtt_port, "watcher")
    watcher.subscribe("status/+", 1)
    web = PahoClient(server.port, "web", transport="websockets",
                     will=("status/web", b"lost", 1, False))
    assert web.subscribe("ws/+", 1) == [1]
    before = stats(server.port)["subscriptions"]
    web.drop()
    (will,) = watcher.receive(1)
    assert (will.topic, will.payload) == ("status/web", b"lost")
    deadline = time.monotonic() + 5
    while stats(server.port)["subscriptions"] != before - 1 and time.monotonic() < deadline:
        time.sleep(0.05)
    assert stats(server.port)["subscriptions"] == before - 1


def test_keep_alive_expiry_closes_and_publishes_the_will(server) -> None:  # type: ignore[no-untyped-def]
    watcher = PahoClient(server.mqtt_port, "watcher")
    watcher.subscribe("status/#", 0)
    silent = MqttRawClient(server.mqtt_port)
    connack = silent.connect("silent", keep_alive=1, will=mqtt.Will("status/silent", b"x", 0,
                                                                     False))
    assert connack == mqtt.Connack(False, 0)
    started = time.monotonic()
    assert silent.closed_by_server(timeout=60)  # a hang guard, not the claim
    # not before 1.5 x keep-alive (the server's wait began before the CONNACK was sent;
    # a busy box can only make it later, so no upper bound but the guard)
    assert time.monotonic() - started > 1.2
    assert "nothing received for 1.5 x keep-alive 1 s" in server.log()
    assert [m.payload for m in watcher.receive(1)] == [b"x"]
    # a client that pings is kept: 2.4 s, past 1.5 x keep-alive, a ping every 0.2 s
    pinging = MqttRawClient(server.mqtt_port)
    pinging.connect("pinging", keep_alive=1)
    for _ in range(12):
        time.sleep(0.2)
        pinging.send(mqtt.Pingreq())
        assert pinging.recv() == mqtt.Pingresp()


def test_connect_refusals(server) -> None:  # type: ignore[no-untyped-def]
    old = MqttRawClient(server.mqtt_port)
    assert old.connect("old", protocol_name="MQIsdp", level=3) == mqtt.Connack(False, 1)
    assert old.closed_by_server()
    anonymous = MqttRawClient(server.mqtt_port)
    assert anonymous.connect("", clean_session=False) == mqtt.Connack(False, 2)
    assert anonymous.closed_by_server()


def test_persistent_session_gets_what_it_missed(server) -> None:  # type: ignore[no-untyped-def]
    device = PahoClient(server.mqtt_port, "device-7", clean_session=False)
    assert not device.session_present
    device.subscribe("cmd/device-7/#", 1)
    publisher = PahoClient(server.mqtt_port, "ctl")
    publisher.publish("cmd/device-7/a", b"1", qos=1)
    assert [m.payload for m in device.receive(1)] == [b"1"]
    device.stop()
    for i in (2, 3, 4):
        publisher.publish(f"cmd/device-7/{'ab'[i % 2]}", str(i).encode(), qos=1)
    back = PahoClient(server.mqtt_port, "device-7", clean_session=False)
    assert back.session_present
    got: list[bytes] = []
    while not {b"2", b"3", b"4"} <= set(got):
        got += [m.payload for m in back.receive(1)]
    # at least once: "1" comes again only if its PUBACK lost the race with DISCONNECT
    assert sorted(set(got)) in ([b"2", b"3", b"4"], [b"1", b"2", b"3", b"4"]), got
    assert back.nothing_more()
    publisher.publish("cmd/device-7/a", b"5", qos=1)  # the subscription is live again
    assert [m.payload for m in back.receive(1)] == [b"5"]
    back.stop()
    clean = PahoClient(server.mqtt_port, "device-7", clean_session=True)
    assert not clean.session_present
    clean.stop()
    again = PahoClient(server.mqtt_port, "device-7", clean_session=False)
    assert not again.session_present  # the clean session discarded it


def test_native_clients_cannot_touch_session_subjects(server) -> None:  # type: ignore[no-untyped-def]
    native = RawClient(server.port)
    native.connect("native")
    status = native.publish(Message("/$mqtt-session/00", b"{}", closure="x"))
    assert status.status is ops.Status.PUBLISH_DENIED
    native.subscribe("/$mqtt-session/00")
    deny = native.recv_op()
    assert isinstance(deny, ops.SubjectStatus) and deny.status is ops.Status.SUBSCRIBE_DENY
    # nor HTTP: a persistent session's record is not served by GET /snapshot
    PahoClient(server.mqtt_port, "kept", clean_session=False).subscribe("a/b", 1)
    subject = "/$mqtt-session/" + b"kept".hex()
    with pytest.raises(urllib.error.HTTPError) as refused:
        urllib.request.urlopen(
            f"http://127.0.0.1:{server.port}/snapshot?subject={subject}", timeout=5
        )
    assert refused.value.code == 403


def test_no_client_reads_any_reserved_subject(server) -> None:  # type: ignore[no-untyped-def]
    """``/$`` subjects are the server's own: the rebalancer's load reports (the cluster's
    members and their clients) are not for clients to read either, on any front end."""
    native = RawClient(server.port)
    native.connect("native")
    for subject in ("/$migratory/load/10.0.0.2:8800", "/$other/thing"):
        native.subscribe(subject)
        deny = native.recv_op()
        assert isinstance(deny, ops.SubjectStatus), deny
        assert deny.status is ops.Status.SUBSCRIBE_DENY, deny
        assert "reserved" in (deny.reason or ""), deny
        for path in ("snapshot", "events"):
            with pytest.raises(urllib.error.HTTPError) as refused:
                urllib.request.urlopen(
                    f"http://127.0.0.1:{server.port}/{path}?subject={subject}", timeout=5
                )
            assert refused.value.code == 403, (path, subject)


def test_mqtt_over_websocket_on_the_native_port(server) -> None:  # type: ignore[no-untyped-def]
    web = PahoClient(server.port, "browser", transport="websockets")
    assert web.subscribe("ws/+", 1) == [1]
    tcp = PahoClient(server.mqtt_port, "tcp")
    tcp.subscribe("ws/#", 1)
    web.publish("ws/a", b"over websocket", qos=1)
    tcp.publish("ws/b", b"over tcp", qos=1)
    assert sorted(m.payload for m in web.receive(2)) == [b"over tcp", b"over websocket"]
    assert sorted(m.payload for m in tcp.receive(2)) == [b"over tcp", b"over websocket"]
    native = RawClient(server.port)  # the native protocol still works on the same port
    native.connect("native")
    assert native.publish(Message("/ws/c", b"native", closure="n")).status is (
        ops.Status.PUBLISH_OK
    )
    assert [m.payload for m in web.receive(1)] == [b"native"]


def test_every_front_end_reaches_mqtt_and_mqtt_reaches_every_front_end(server) -> None:  # type: ignore[no-untyped-def]
    """Published via native, HTTP and MQTT; received on native, SSE and MQTT, with the
    same positions."""
    from httpclient import HttpClient, SseClient

    subject, topic = "/Stocks/NYSE/IBM", "Stocks/NYSE/IBM"
    mqtt_sub = PahoClient(server.mqtt_port, "everywhere")
    mqtt_sub.subscribe(topic, 1)
    native = RawClient(server.port)
    native.connect("native")
    native.subscribe(subject)
    native.recv_op()  # SUBSCRIBE_ALLOW
    stream = SseClient(server.port, [subject])
    assert stream.next_event()["event"] == "subscribe"  # type: ignore[index]
    publisher = RawClient(server.port)
    publisher.connect("native-pub")
    publisher.publish(Message(subject, b"native", closure="1"))
    status, body = HttpClient(server.port).publish(subject=subject, content="http")
    assert status == 200 and body["seq"] == 2
    PahoClient(server.mqtt_port, "mqtt-pub").publish(topic, b"mqtt", qos=1)
    expected = [(b"native", 1), (b"http", 2), (b"mqtt", 3)]
    assert [(m.content, m.seq) for m in native.recv_messages(3)] == expected
    events = [stream.next_event() for _ in range(3)]
    assert [(e["data"]["content"].encode(), e["data"]["seq"]) for e in events if e] == expected
    assert [m.payload for m in mqtt_sub.receive(3)] == [b"native", b"http", b"mqtt"]


def test_a_resume_past_the_cache_of_a_subject_without_a_snapshot_is_an_empty_retain(
    start_server,  # type: ignore[no-untyped-def]
) -> None:
    """paho sees the resync of a subject with no retained message: an empty PUBLISH with
    RETAIN at QoS 1 ("no retained value": reset), then live messages. Before: nothing --
    "2" and "3" silently missed (docs/mqtt.md)."""
    server = start_server(ListenMqtt="127.0.0.1:0", BatchTime="0", MaxCachedMessagesPerSubject="1")
    device = PahoClient(server.mqtt_port, "device-8", clean_session=False)
    device.subscribe("dev/x", 1)
    publisher = PahoClient(server.mqtt_port, "ctl")
    publisher.publish("dev/x", b"1", qos=1)
    assert [m.payload for m in device.receive(1)] == [b"1"]
    device.stop()
    for payload in (b"2", b"3", b"4"):  # not retained; the cache keeps "4" alone
        publisher.publish("dev/x", payload, qos=1)
    back = PahoClient(server.mqtt_port, "device-8", clean_session=False)
    assert back.session_present
    (reset,) = back.receive(1)
    assert (reset.topic, reset.payload, reset.qos, reset.retain) == ("dev/x", b"", 1, True)
    publisher.publish("dev/x", b"5", qos=1)
    assert [m.payload for m in back.receive(1)] == [b"5"]
    assert back.nothing_more()
    back.stop()
    publisher.stop()
