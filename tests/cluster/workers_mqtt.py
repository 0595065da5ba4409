"""MQTT devices and a publisher for the Workers kill tests (real processes, 127.0.0.1).

A :class:`Device` is an MQTT 3.1.1 session on a raw socket through the server's shared
MQTT port: it PUBACKs only what it is told to, reconnects on whichever worker the
kernel picks (counting the attempts a worker refused or dropped: not caught up yet,
just killed), and waits for named payloads -- a wait that ends without them says which
stage, which payloads are missing and what came instead, not a bare ``queue.Empty``.
:func:`worker_holding` tells which worker process holds a client's connection, from the
kernel's socket tables (not from the order of any output)."""

from __future__ import annotations

import os
import socket
import sys
import time
from collections.abc import Iterable
from pathlib import Path

from test_workers import SUBJECT, WorkersServer, connect
from workers_reading import missing_text

from cluster.sequencer import worker_name

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "server"))
from mqttclient import MqttRawClient

from migratory.model.message import Message, Qos
from migratory.model.position import Position
from migratory.model.topic import subject_to_topic
from migratory.protocol import mqtt, ops

TOPIC = subject_to_topic(SUBJECT)
SILENCE = 10.0
"""Seconds without any packet after which a wait for deliveries gives up (and says what
is missing); a bound on a hang, not a speed figure."""


def mqtt_port(server: WorkersServer) -> int:
    url = next(u for u in server.listening if u.startswith("mqtt:"))
    return int(url.rsplit(":", 1)[1])


class Device:
    """One MQTT client id; :attr:`payloads`: every PUBLISH payload in the order it came
    (redeliveries included), :attr:`held`: packet ids received and not PUBACKed yet."""

    def __init__(self, port: int, client_id: str, *, clean_session: bool = False) -> None:
        self.port, self.client_id, self.clean_session = port, client_id, clean_session
        self.payloads: list[bytes] = []
        self.held: list[int] = []
        self.refused = 0  # attempts a worker refused (CONNACK != 0) or dropped
        self.client: MqttRawClient | None = None

    def connect(self) -> bool | None:
        """One attempt: None if refused or dropped, else ``session_present``."""
        self.close()
        try:
            self.client = MqttRawClient(self.port, timeout=5)
            connack = self.client.connect(self.client_id, clean_session=self.clean_session)
        except (OSError, AssertionError):
            self.close()
            self.refused += 1
            return None
        if connack.return_code != 0:
            self.close()
            self.refused += 1
            return None
        self.held = []  # (ids of a connection that is gone)
        return connack.session_present

    def reconnect(self, timeout: float = 30) -> bool:
        """Until a worker takes the client id (at once, no pause: a device that comes
        back while its worker restarts); ``session_present``. The bound is for a hang."""
        deadline = time.monotonic() + timeout
        while (present := self.connect()) is None:
            assert time.monotonic() < deadline, (
                f"{self.client_id}: no worker took the connection in {timeout} s "
                f"({self.refused} attempts refused)")
            time.sleep(0.01)
        return present

    def subscribe(self, qos: int = 1) -> None:
        assert self.client is not None
        suback = self.client.subscribe(TOPIC, qos=qos)
        assert suback.return_codes == (qos,), suback

    def ack_held(self) -> None:
        assert self.client is not None
        for packet_id in self.held:
            self.client.send(mqtt.Puback(packet_id))
        self.held = []

    def receive_until(self, wanted: Iterable[bytes], *, stage: str, ack: bool = True) -> None:
        """Until every one of ``wanted`` has come (on this connection or before), PUBACKed
        as they come (``ack``) or held. A silence of SILENCE seconds or a closed
        connection fails, naming ``stage`` and what is missing."""
        wanted = list(wanted)
        assert self.client is not None
        while not set(wanted) <= set(self.payloads):
            try:
                packet = self.client.recv(SILENCE)
            except (OSError, ConnectionError) as exc:
                raise AssertionError(
                    f"{self.client_id}, {stage}: {type(exc).__name__} ({exc}) with "
                    f"{missing_text(wanted, self.payloads)}; "
                    f"{len(self.payloads)} deliveries so far") from None
            if not isinstance(packet, mqtt.Publish):
                continue
            self.payloads.append(packet.payload)
            if packet.qos:
                assert packet.packet_id is not None
                if ack:
                    self.client.send(mqtt.Puback(packet.packet_id))
                else:
                    self.held.append(packet.packet_id)

    def receive(self, count: int, *, stage: str, ack: bool = True) -> None:
        """``count`` more deliveries (redeliveries included), PUBACKed; a silence of
        SILENCE seconds fails, naming ``stage`` and how many came."""
        assert self.client is not None
        came = 0
        while came < count:
            try:
                publish = self.client.recv(SILENCE)
            except (OSError, ConnectionError) as exc:
                raise AssertionError(f"{self.client_id}, {stage}: {came} of {count} came; "
                                     f"then {type(exc).__name__} ({exc})") from None
            if not isinstance(publish, mqtt.Publish):
                continue
            came += 1
            assert publish.qos == 1 and publish.packet_id is not None, publish
            self.payloads.append(publish.payload)
            if ack:
                self.client.send(mqtt.Puback(publish.packet_id))
            else:
                self.held.append(publish.packet_id)

    def nothing_more(self, wait: float = 0.5) -> list[bytes]:
        """What comes within ``wait`` seconds (a clean session's new connection: nothing)."""
        assert self.client is not None
        came = []
        try:
            while True:
                packet = self.client.recv(wait)
                if isinstance(packet, mqtt.Publish):
                    came.append(packet.payload)
        except TimeoutError:
            return came

    def close(self) -> None:
        if self.client is not None:
            self.client.close()
            self.client = None


class Publisher:
    """Publishes through the port (``qos``: Guaranteed by default, so QoS 1 deliveries),
    reconnecting when its worker dies; a publish whose status was lost is unknown, not
    acknowledged. :attr:`positions`: each acknowledged one's."""

    def __init__(self, port: int, avoid: int | None = None, qos: Qos = Qos.GUARANTEED) -> None:
        """``avoid``: a worker index the publisher is not to start on."""
        self.port, self.qos = port, qos
        self.client, worker = connect(port, "publisher", timeout=30)
        while avoid is not None and worker == f"migratory-{worker_name(avoid)}":
            self.client.close()
            self.client, worker = connect(port, "publisher", timeout=30)
        self.acked: list[bytes] = []
        self.positions: dict[bytes, Position] = {}
        self.unknown: list[bytes] = []

    def publish(self, count: int) -> list[bytes]:
        """``count`` more messages; those acknowledged."""
        acked = []
        for _ in range(count):
            content = f"m{len(self.acked) + len(self.unknown):04d}".encode()
            message = Message(SUBJECT, content, closure=content.decode(), qos=self.qos)
            try:
                status = self.client.publish(message)
            except (OSError, AssertionError):
                self.unknown.append(content)
                self.client.close()
                self.client, _ = connect(self.port, "publisher", timeout=30)
                continue
            assert status.status is ops.Status.PUBLISH_OK, status
            assert status.position is not None
            self.acked.append(content)
            self.positions[content] = status.position
            acked.append(content)
        return acked


def firsts(payloads: list[bytes]) -> list[bytes]:
    """Each payload once, where it first came (QoS 1: a redelivery is allowed)."""
    return list(dict.fromkeys(payloads))


def worker_holding(server: WorkersServer, sock: socket.socket) -> int:
    """The index of the worker whose process holds the server side of ``sock``."""
    ours = sock.getsockname()[1]
    server_port = sock.getpeername()[1]
    inode = None
    for line in Path("/proc/net/tcp").read_text().splitlines()[1:]:
        fields = line.split()
        local, remote = fields[1], fields[2]
        if int(local.split(":")[1], 16) == server_port and int(remote.split(":")[1], 16) == ours:
            inode = fields[9]
    assert inode is not None, f"no server socket for port {ours}"
    for index, pid in server.pids.items():
        try:
            links = [os.readlink(f"/proc/{pid}/fd/{fd}") for fd in os.listdir(f"/proc/{pid}/fd")]
        except FileNotFoundError:  # (a worker gone meanwhile)
            continue
        if f"socket:[{inode}]" in links:
            return index
    raise AssertionError(f"no worker holds the connection from port {ours}")
