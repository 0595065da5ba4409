"""A blocking raw-socket MQTT client built on our own codec (for what paho cannot
send: malformed packets, silence past the keep-alive, a connection dropped mid-way)."""

from __future__ import annotations

import json
import socket
import time
import urllib.request
from typing import Any

from migratory.protocol import mqtt, mqtt_encode


class MqttRawClient:
    def __init__(self, port: int, *, timeout: float = 5.0) -> None:
        self.sock = socket.create_connection(("127.0.0.1", port), timeout=timeout)
        self.decoder = mqtt.MqttDecoder(server=False, max_packet_size=64 << 20)
        self.timeout = timeout

    def send(self, packet: mqtt.Packet) -> None:
        self.sock.sendall(mqtt_encode.encode_packet(packet))

    def send_raw(self, data: bytes) -> None:
        self.sock.sendall(data)

    def connect(self, client_id: str = "raw", **kw: object) -> mqtt.Connack:
        self.send(mqtt.Connect(client_id, **kw))  # type: ignore[arg-type]
        reply = self.recv()
        assert isinstance(reply, mqtt.Connack), reply
        return reply

    def subscribe(self, *filters: str, qos: int = 0, packet_id: int = 1) -> mqtt.Suback:
        self.send(mqtt.Subscribe(packet_id, tuple((f, qos) for f in filters)))
        while True:  # retained messages may come first
            reply = self.recv()
            if isinstance(reply, mqtt.Suback):
                return reply

    def recv(self, timeout: float | None = None) -> mqtt.Packet:
        deadline = time.monotonic() + (timeout or self.timeout)
        while True:
            packet = self.decoder.next_event()
            if packet is not None:
                return packet
            left = deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError("no MQTT packet in time")
            self.sock.settimeout(left)
            data = self.sock.recv(65536)
            if not data:
                raise ConnectionError("server closed the connection")
            self.decoder.receive_data(data)

    def recv_publishes(self, count: int, timeout: float | None = None) -> list[mqtt.Publish]:
        out: list[mqtt.Publish] = []
        while len(out) < count:
            packet = self.recv(timeout)
            if isinstance(packet, mqtt.Publish):
                out.append(packet)
        return out

    def publish_burst(self, count: int, subjects: int) -> list[int]:
        """``count`` QoS 1 PUBLISHes over ``subjects`` topics in one write; the packet ids
        of the PUBACKs in the order they came (MQTT 3.1.1 section 4.6: the PUBLISHes')."""
        ids = [n % 65535 + 1 for n in range(count)]
        self.send_raw(b"".join(
            mqtt_encode.encode_packet(mqtt.Publish(
                f"burst/s{n % subjects}/x", b"%d" % n, qos=1, retain=False, packet_id=ids[n]))
            for n in range(count)))
        acked: list[int] = []
        while len(acked) < count:
            packet = self.recv()
            if isinstance(packet, mqtt.Puback):
                acked.append(packet.packet_id)
        return acked

    def closed_by_server(self, timeout: float = 5.0) -> bool:
        """Whether the server closes the connection within ``timeout`` (reading the rest)."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            self.sock.settimeout(max(0.01, deadline - time.monotonic()))
            try:
                if not self.sock.recv(65536):
                    return True
            except TimeoutError:
                return False
            except ConnectionResetError:
                return True
        return False

    def close(self) -> None:
        self.sock.close()


def stats(port: int) -> dict[str, Any]:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/stats", timeout=5) as reply:
        result: dict[str, Any] = json.loads(reply.read())
        return result


def wait_subscriptions(port: int, count: int, timeout: float = 15) -> None:
    """Until the server holds ``count`` subscriptions (a client's SUBSCRIBE arrived)."""
    deadline = time.monotonic() + timeout
    while stats(port)["subscriptions"] < count:
        assert time.monotonic() < deadline, f"fewer than {count} subscriptions"
        time.sleep(0.05)
