"""The per-connection limits hold for MQTT connections as for native WebSocket ones
(issue 14): publishes per second, subscriptions per connection, filters per SUBSCRIBE,
bytes held before a packet is complete, packets handled per turn. Over-limit traffic
comes from a raw socket and from paho-mqtt; the refusal is the documented one (a closed
connection -- MQTT 3.1.1 has no negative acknowledgement -- or SUBACK 0x80), and a
bystander client in its own process keeps receiving while the attack is on (a count of
its messages, not a delay; a flood's fairness is shown by order: turns.py)."""

from __future__ import annotations

import json
import queue
import socket
import time
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import pytest
from bystander import Bystander, rss_kib
from mqttclient import MqttRawClient
from paho_client import PahoClient
from turns import FAIR_RUN, frozen, longest_attacker_run, queue_without_blocking

from migratory.protocol import mqtt, mqtt_encode

pytestmark = pytest.mark.slow


def stats(port: int) -> dict[str, Any]:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/stats", timeout=10) as reply:
        result: dict[str, Any] = json.loads(reply.read())
        return result


SERVED_DURING_ATTACK = 5
"""The bystander's messages published after the attack started and delivered while it is
on (a server stalled by the attack serves at most the one in flight)."""


@contextmanager
def bystander(server: Any) -> Iterator[Bystander]:
    """A bystander marked at the start of the attack; the test says when to count."""
    watcher = Bystander(server.port)
    figures = watcher.figures
    figures["rss_before_kib"] = rss_kib(server.proc.pid)
    watcher.attack_started()
    try:
        yield watcher
    finally:
        watcher.stop()
        print(f"bystander p50 {figures['p50_ms']} ms max {figures['max_ms']} ms over "
              f"{figures['count']} messages, {figures.get('served_during_attack')} during "
              f"the attack, lost {figures['lost']}")
    assert figures.get("served_during_attack", 0) >= SERVED_DURING_ATTACK, figures
    assert figures["lost"] == 0, figures  # (its count in 1.5 s: a speed figure)


def publish_packets(count: int, topic: str = "flood/a", size: int = 10) -> bytes:
    return mqtt_encode.encode_packet(mqtt.Publish(topic, b"p" * size)) * count


def test_publishing_faster_than_the_limit_closes_the_connection(start_server: Any) -> None:
    server = start_server(ListenMqtt="127.0.0.1:0", MaxPublishesPerSecond="100")
    watcher = PahoClient(server.mqtt_port, "watcher")
    watcher.subscribe("flood/#")
    calm = PahoClient(server.mqtt_port, "calm")
    with bystander(server) as watching:
        for i in range(20):  # within the limit: every one delivered
            calm.publish("flood/calm", str(i).encode(), qos=1)
        attacker = MqttRawClient(server.mqtt_port)
        attacker.connect("flooder")
        attacker.send_raw(publish_packets(5_000))  # one burst: 50 times the limit
        watching.served_during_attack(SERVED_DURING_ATTACK)
        assert attacker.closed_by_server(), "the flooder was not cut off"
    assert stats(server.port)["publishes_refused"] == 1
    got = watcher.receive(20)
    assert [m.payload for m in got] == [str(i).encode() for i in range(20)]
    flooded = [m for m in drain(watcher) if m.topic == "flood/a"]
    assert 90 <= len(flooded) <= 110, len(flooded)  # one second's worth, then closed
    assert not calm.disconnected.is_set()


def drain(client: PahoClient, wait: float = 1.0) -> list[Any]:
    """Every message until none came for ``wait`` seconds."""
    out = []
    while True:
        try:
            out.append(client.messages.get(timeout=wait))
        except queue.Empty:
            return out


def test_paho_publishing_past_the_limit_is_disconnected(start_server: Any) -> None:
    server = start_server(ListenMqtt="127.0.0.1:0", MaxPublishesPerSecond="50")
    client = PahoClient(server.mqtt_port, "eager")
    with bystander(server) as watching:
        for i in range(500):
            if client.disconnected.is_set():
                break
            client.client.publish("eager/topic", str(i).encode())
        watching.served_during_attack(SERVED_DURING_ATTACK)
        assert client.disconnected.wait(5), "paho was not disconnected"
    assert stats(server.port)["publishes_refused"] == 1


def test_subscriptions_per_connection(start_server: Any) -> None:
    server = start_server(ListenMqtt="127.0.0.1:0", MaxSubscriptionsPerConnection="5")
    client = PahoClient(server.mqtt_port, "collector")
    assert [client.subscribe(f"many/t{i}")[0] for i in range(5)] == [0] * 5
    assert client.subscribe("many/t5") == [mqtt.SUBACK_FAILURE]  # 0x80
    assert client.subscribe("many/t0") == [0]  # the same filter again is no new one
    assert not client.disconnected.is_set()
    publisher = PahoClient(server.mqtt_port, "p")
    publisher.publish("many/t5", b"not for it", qos=1)
    publisher.publish("many/t4", b"for it", qos=1)
    assert [m.payload for m in client.receive(1)] == [b"for it"]
    assert client.nothing_more()


def test_too_many_filters_in_one_subscribe_close_before_any_work(start_server: Any) -> None:
    server = start_server(ListenMqtt="127.0.0.1:0", MaxSubjectsPerSubscribe="100")
    with bystander(server) as watching:
        attacker = MqttRawClient(server.mqtt_port)
        attacker.connect("greedy")
        attacker.send(mqtt.Subscribe(1, tuple((f"g/{i}", 0) for i in range(101))))
        watching.served_during_attack(SERVED_DURING_ATTACK)
        assert attacker.closed_by_server()
        client = PahoClient(server.mqtt_port, "paho-greedy")
        client.client.subscribe([(f"p/{i}", 0) for i in range(101)])
        assert client.disconnected.wait(5)
        held = MqttRawClient(server.mqtt_port)  # an UNSUBSCRIBE is bounded as well
        held.connect("unsubscriber")
        held.send(mqtt.Unsubscribe(2, tuple(f"g/{i}" for i in range(101))))
        assert held.closed_by_server()  # (before: UNSUBACK, the connection kept)
    body = stats(server.port)
    assert body["subscribes_refused"] == 3 and body["subscriptions"] == 0
    fine = MqttRawClient(server.mqtt_port)
    fine.connect("modest")
    assert fine.subscribe(*(f"g/{i}" for i in range(100))).return_codes == (0,) * 100


def test_bytes_held_before_a_complete_packet(start_server: Any) -> None:
    """Connections each holding most of a 1 MiB PUBLISH: past IncompleteFrameBudget
    (4 MiB here) the next one is closed, and the memory goes when they leave."""
    server = start_server(ListenMqtt="127.0.0.1:0", IncompleteFrameBudget=str(4 << 20))
    body = b"t" * ((1 << 20) - 64)
    packet = mqtt_encode.encode_packet(mqtt.Publish("held/a", body))
    sockets: list[socket.socket] = []
    closed = 0
    with bystander(server) as watching:
        for i in range(8):
            raw = MqttRawClient(server.mqtt_port)
            raw.connect(f"holder{i}")
            raw.send_raw(packet[:-1])  # all but the last byte
            time.sleep(0.2)
            if raw.closed_by_server(timeout=0.5):
                closed += 1
            sockets.append(raw.sock)
        watching.served_during_attack(SERVED_DURING_ATTACK)  # while they are held
    assert 3 <= 8 - closed <= 4, closed  # about 4 MiB held, the others refused
    # a packet bigger than MaxFrameSize is refused from its header alone
    big = MqttRawClient(server.mqtt_port)
    big.connect("big")
    big.send_raw(mqtt_encode.encode_packet(mqtt.Publish("held/b", b"x" * (2 << 20)))[:16])
    assert big.closed_by_server()
    for sock in sockets:
        sock.close()


def test_a_packet_flood_waits_for_the_others_turn(start_server: Any) -> None:
    """200,000 PINGREQs in one go are handled OPERATIONS_PER_TURN per turn: a bystander's
    publishes, ready at the same moment, are handled in between -- shown by the order of
    the attacker's own stream, which carries them too (turns.py), not by a clock."""
    server = start_server(ListenMqtt="127.0.0.1:0", BatchTime="0")
    attacker = MqttRawClient(server.mqtt_port, timeout=30)
    attacker.connect("pinger")
    attacker.subscribe("turns/bystander")
    bystanders = [MqttRawClient(server.mqtt_port, timeout=30) for _ in range(2)]
    for i, bystander in enumerate(bystanders):
        bystander.connect(f"bystander{i}")
    flood = mqtt_encode.encode_packet(mqtt.Pingreq()) * 200_000
    publishes = [b"".join(mqtt_encode.encode_packet(mqtt.Publish("turns/bystander", b"%d" % i))
                          for i in range(j * 100, j * 100 + 100)) for j in range(2)]
    with frozen(server.proc.pid):  # ready in this order: bystander, attacker, bystander
        bystanders[0].send_raw(publishes[0])  # 2 KB each: they fit in the socket's buffers
        queued = queue_without_blocking(attacker.sock, flood)
        bystanders[1].send_raw(publishes[1])
    assert queued >= 65536, queued  # a whole received chunk at least: thousands of pings
    attacker.send_raw(flood[queued:])
    stream: list[bool] = []  # True: a bystander's message, False: a PINGRESP
    while len(stream) < 200_200:
        packet = attacker.recv()
        assert isinstance(packet, mqtt.Pingresp | mqtt.Publish), packet
        stream.append(isinstance(packet, mqtt.Publish))
    assert stream.count(True) == 200
    assert longest_attacker_run(stream) <= FAIR_RUN, longest_attacker_run(stream)
    body = stats(server.port)
    assert body["messages_published"] == 200 and body["slow_consumers"] == 0
