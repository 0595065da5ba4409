"""One cycle of ``benchmarks/soak.py``'s churn: clients of every kind that come and go.

Every client is a blocking loopback socket with a short timeout, done one after the
other; every subject is new in each cycle (``/soak/c<cycle>/...``) except one shared
subject. A third of the clients leave politely (close frame, MQTT DISCONNECT), a third
by a reset (SO_LINGER 0: RST, no close frame), a third by a plain close (FIN, no close
frame). A client that fails is counted by kind and reason; the cycle goes on.
"""

from __future__ import annotations

import contextlib
import json
import os
import socket
import struct
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import cbor2

from migratory.bench.sse import open_stream
from migratory.bench.wsraw import decode_frames, masked, open_raw, publish_frame
from migratory.protocol import mqtt, mqtt_encode
from migratory.protocol.http import handshake_request, new_websocket_key
from migratory.protocol.websocket import encode_close

TIMEOUT = 3.0  # seconds any one client may take
SHARED = "/soak/shared/all"  # the one subject every cycle uses
ENDINGS = ("polite", "reset", "fin")


def end(sock: socket.socket, how: str, goodbye: bytes = b"") -> None:
    """Leave: ``polite`` sends ``goodbye`` (if any) and waits (bounded) for the server's
    close;
    ``reset`` closes with an RST; ``fin`` closes without a word."""
    with contextlib.suppress(OSError):
        if how == "polite":
            if goodbye:
                sock.sendall(goodbye)
            deadline = time.monotonic() + TIMEOUT
            sock.settimeout(TIMEOUT)
            while time.monotonic() < deadline and sock.recv(65536):
                pass
        elif how == "reset":
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    sock.close()


def read_ops(sock: socket.socket, buf: bytes, enough: Callable[[list[Any]], bool]) -> bytes:
    """Read native server ops until ``enough(every op so far)``; the bytes left."""
    seen: list[Any] = []
    deadline = time.monotonic() + TIMEOUT
    while True:
        ops, buf = decode_frames(buf)
        seen += ops
        if enough(seen):
            return buf
        if time.monotonic() > deadline:
            raise TimeoutError(f"waited for ops; got {seen[-3:]}")
        data = sock.recv(65536)
        if not data:
            raise ConnectionError("closed by the server")
        buf += data


def acks(count: int) -> Callable[[list[Any]], bool]:
    def enough(ops: list[Any]) -> bool:
        return sum(1 for op in ops if isinstance(op, dict) and op.get("op") == "publish_status"
                   and op.get("status") == "PUBLISH_OK") >= count
    return enough


def read_mqtt(sock: socket.socket, buf: bytes, packet_type: int) -> bytes:
    """Read MQTT packets until one of ``packet_type`` (CONNACK, SUBACK, PUBACK); the rest."""
    deadline = time.monotonic() + TIMEOUT
    while True:
        while len(buf) >= 2:
            length, shift, pos = 0, 0, 1
            while pos < len(buf):
                byte = buf[pos]
                length |= (byte & 0x7F) << shift
                shift += 7
                pos += 1
                if not byte & 0x80:
                    break
            else:
                break
            if len(buf) < pos + length:
                break
            kind = buf[0] >> 4
            buf = buf[pos + length:]
            if kind == packet_type:
                return buf
        if time.monotonic() > deadline:
            raise TimeoutError(f"no MQTT packet of type {packet_type}")
        data = sock.recv(65536)
        if not data:
            raise ConnectionError("closed by the server")
        buf += data


def http_exchange(host: str, port: int, request: bytes) -> bytes:
    """Send one request with ``Connection: close``; the whole answer."""
    sock = socket.create_connection((host, port), timeout=TIMEOUT)
    try:
        sock.sendall(request)
        answer = b""
        while chunk := sock.recv(65536):
            answer += chunk
        return answer
    finally:
        sock.close()


@dataclass
class Churn:
    """What one cycle does, and how often: ``ws`` native WebSocket clients, ``sse``
    event streams, ``http`` POST /publish + GET /snapshot, ``mqtt`` clean MQTT sessions,
    ``persistent`` MQTT sessions (half with an id new each cycle, half with an id
    reused), ``bad`` of each kind of broken client; ``names``: see :meth:`cycle`."""

    host: str
    port: int
    mqtt_port: int
    ws: int = 12
    sse: int = 6
    http: int = 6
    mqtt: int = 6
    persistent: int = 4
    bad: int = 2
    names: int = 0
    done: Counter[str] = field(default_factory=Counter)
    failed: Counter[str] = field(default_factory=Counter)

    def cycle(self, c: int) -> None:
        """Cycle ``c``: its subjects and client ids are named by ``c``, or by ``c`` modulo
        ``names`` (a pool of names that come back, in new epochs once forgotten)."""
        if self.names:
            c = c % self.names
        actions: list[tuple[str, int, Callable[[int, int], None]]] = [
            ("ws", self.ws, self.ws_client),
            ("sse", self.sse, self.sse_client),
            ("http", self.http, self.http_client),
            ("mqtt", self.mqtt if self.mqtt_port else 0, self.mqtt_client),
            ("mqtt-persistent", self.persistent if self.mqtt_port else 0,
             self.mqtt_persistent),
            ("bad", self.bad, self.bad_clients),
        ]
        for name, count, action in actions:
            for i in range(count):
                try:
                    action(c, i)
                except (OSError, ValueError, cbor2.CBORDecodeError) as exc:
                    self.failed[f"{name}: {type(exc).__name__}: {str(exc)[:60]}"] += 1
                else:
                    self.done[name] += 1

    # --- native WebSocket --------------------------------------------------------------

    def ws_client(self, c: int, i: int) -> None:
        sock, buf = open_raw(self.port, f"soak-{c}-{i}", TIMEOUT, host=self.host)
        how = ENDINGS[i % 3]
        try:
            base = f"/soak/c{c}/w{i}"
            subjects = [f"{base}/plain", f"{base}/conflated", f"{base}/history"]
            sock.sendall(masked(cbor2.dumps({"op": "subscribe", "subjects": [
                {"subject": subjects[0]},
                {"subject": subjects[1], "conflation": 100},
                {"subject": subjects[2], "history": 5},
                {"subject": SHARED},
                # a resume from a position this server never gave: DATA_RESYNC
                {"subject": f"{base}/resumed", "epoch": 12345, "seq": 7},
            ]})))
            for k, subject in enumerate([*subjects, SHARED]):
                sock.sendall(publish_frame(subject, os.urandom(64), f"p{k}"))
            buf = read_ops(sock, buf, acks(4))
            if i % 2:
                sock.sendall(masked(cbor2.dumps({"op": "unsubscribe", "subjects": subjects})))
                sock.sendall(masked(cbor2.dumps({"op": "ping", "id": 1})))
                buf = read_ops(sock, buf, lambda ops: any(
                    isinstance(op, dict) and op.get("op") == "pong" for op in ops))
        finally:
            end(sock, how, encode_close(1000, mask=os.urandom(4)))

    # --- Server-Sent Events ------------------------------------------------------------

    def sse_client(self, c: int, i: int) -> None:
        subject = f"/soak/c{c}/s{i}"
        if i % 2:  # a stream of two subjects, one of them the shared one
            subject = f"{subject}&subject={SHARED}"
        conn = open_stream(self.host, self.port, subject, None, time.monotonic() + TIMEOUT)
        sock = conn.sock
        sock.setblocking(True)
        end(sock, ENDINGS[i % 3] if i % 3 else "fin")  # an SSE client has no goodbye

    # --- HTTP --------------------------------------------------------------------------

    def http_client(self, c: int, i: int) -> None:
        subject = f"/soak/c{c}/h{i}"
        body = json.dumps({"subject": subject, "content": "x" * 32}).encode()
        host = f"{self.host}:{self.port}"
        answer = http_exchange(self.host, self.port, (
            f"POST /publish HTTP/1.1\r\nHost: {host}\r\nContent-Type: application/json\r\n"
            f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n"
        ).encode() + body)
        if not answer.startswith(b"HTTP/1.1 200"):
            raise ValueError(f"publish answered {answer[:40]!r}")
        answer = http_exchange(self.host, self.port, (
            f"GET /snapshot?subject=/soak/c{c}/never{i} HTTP/1.1\r\nHost: {host}\r\n"
            "Connection: close\r\n\r\n"
        ).encode())
        if not answer.startswith(b"HTTP/1.1 404"):
            raise ValueError(f"snapshot answered {answer[:40]!r}")

    # --- MQTT --------------------------------------------------------------------------

    def _mqtt_session(self, client_id: str, clean: bool, c: int, i: int, how: str) -> None:
        sock = socket.create_connection((self.host, self.mqtt_port), timeout=TIMEOUT)
        try:
            will = mqtt.Will(f"soak/c{c}/will{i}", b"gone", 0, False)  # on a reset or a FIN
            sock.sendall(mqtt_encode.encode_packet(
                mqtt.Connect(client_id, clean_session=clean, keep_alive=30, will=will)))
            buf = read_mqtt(sock, b"", mqtt.CONNACK)
            topic = f"soak/c{c}/m{i}"
            sock.sendall(mqtt_encode.encode_packet(mqtt.Subscribe(1, (
                (topic, 1), (f"soak/c{c}/+/wild", 0), (f"soak/c{c}/#", 0)))))
            buf = read_mqtt(sock, buf, mqtt.SUBACK)
            publish = mqtt.Publish(topic, b"m" * 32, qos=1, packet_id=7)
            sock.sendall(mqtt_encode.encode_packet(publish))
            read_mqtt(sock, buf, mqtt.PUBACK)
        finally:
            end(sock, how, mqtt_encode.encode_packet(mqtt.Disconnect()))

    def mqtt_client(self, c: int, i: int) -> None:
        self._mqtt_session(f"soak-{c}-{i}", True, c, i, ENDINGS[i % 3])

    def mqtt_persistent(self, c: int, i: int) -> None:
        """Half the ids are used once (a new one each cycle), half again each cycle; of the
        former, half are discarded at once by a clean-session CONNECT, half left to
        MqttSessionExpiry."""
        client_id = f"soak-p{c}-{i}" if i % 2 else f"soak-persist-{i}"
        self._mqtt_session(client_id, False, c, 100 + i, ENDINGS[i % 3])
        if i % 4 == 1:
            self._mqtt_session(client_id, True, c, 200 + i, "polite")

    # --- broken clients ----------------------------------------------------------------

    def bad_clients(self, c: int, i: int) -> None:
        """One of each: a native client's unmasked frame, an incomplete frame then a
        reset, garbage HTTP, a broken MQTT packet, a handshake left half-way."""
        sock, _ = open_raw(self.port, f"soak-bad-{c}-{i}", TIMEOUT, host=self.host)
        sock.sendall(b"\x82\x05hello")  # unmasked: the server closes (1002)
        end(sock, "polite", b"")
        sock, _ = open_raw(self.port, f"soak-part-{c}-{i}", TIMEOUT, host=self.host)
        sock.sendall(b"\x82\xfe\x10\x00abcd" + b"z" * 100)  # 4 KiB announced, 100 sent
        end(sock, "reset")
        http_exchange(self.host, self.port, b"GARBAGE / NOPE\r\n\r\n")
        if self.mqtt_port:
            sock = socket.create_connection((self.host, self.mqtt_port), timeout=TIMEOUT)
            sock.sendall(mqtt_encode.encode_packet(mqtt.Connect(f"soak-bad-{c}-{i}")))
            read_mqtt(sock, b"", mqtt.CONNACK)
            sock.sendall(b"\xf0\x00")  # reserved packet type: the server closes
            end(sock, "polite", b"")
        sock = socket.create_connection((self.host, self.port), timeout=TIMEOUT)
        key = new_websocket_key()
        sock.sendall(handshake_request(f"{self.host}:{self.port}", "/", key)[:20])
        end(sock, ("reset", "fin")[i % 2])  # (polite would wait for HandshakeTimeout)


class Stayers:
    """Clients that stay the whole run while the others come and go: a native client on
    the shared subject, a persistent MQTT session with a wildcard filter over every
    cycle's subjects, an event stream of the shared subject. Their per-connection state
    (positions reached, subjects delivered) must not grow with the subjects that come and
    go. ``drain()`` reads what they were sent (so none becomes a slow consumer)."""

    def __init__(self, host: str, port: int, mqtt_port: int, name: str = "soak-stayer") -> None:
        self.socks: list[socket.socket] = []
        self.kinds = ("native", "mqtt", "sse") if mqtt_port else ("native", "sse")
        self.received = 0
        self.last: dict[str, bytes] = {}
        self.closed: dict[str, bytes] = {}  # stayers the server closed: their last bytes
        sock, _ = open_raw(port, name, TIMEOUT, host=host)
        sock.sendall(masked(cbor2.dumps({"op": "subscribe", "subjects": [{"subject": SHARED}]})))
        self.socks.append(sock)
        if mqtt_port:
            sock = socket.create_connection((host, mqtt_port), timeout=TIMEOUT)
            sock.sendall(mqtt_encode.encode_packet(
                mqtt.Connect(name, clean_session=False, keep_alive=0)))
            buf = read_mqtt(sock, b"", mqtt.CONNACK)
            sock.sendall(mqtt_encode.encode_packet(mqtt.Subscribe(1, (("soak/#", 0),))))
            read_mqtt(sock, buf, mqtt.SUBACK)
            self.socks.append(sock)
        stream = open_stream(host, port, SHARED, None, time.monotonic() + TIMEOUT)
        self.socks.append(stream.sock)
        for sock in self.socks:
            sock.setblocking(False)

    def drain(self) -> None:
        for kind, sock in zip(self.kinds, self.socks, strict=True):
            if kind in self.closed:
                continue
            for _ in range(1000):  # bounded: 64 MB at most per call
                try:
                    data = sock.recv(65536)
                except (BlockingIOError, InterruptedError):
                    break
                except OSError as exc:
                    data, self.last[kind] = b"", repr(exc).encode()
                if not data:  # said at the end of the run (its last bytes)
                    self.closed[kind] = self.last.get(kind, b"")[-60:]
                    break
                self.received += len(data)
                self.last[kind] = data

    def close(self) -> None:
        for sock in self.socks:
            sock.close()
