#!/usr/bin/env python3
"""Slowloris against the client ports of a real server process, with legitimate clients.

One ``migratory serve`` on 127.0.0.1 with a ``Listen`` port, a ``ListenEncrypted`` port
(trustme certificates) and a ``ListenMqtt`` port, started with RLIMIT_NOFILE ``--files``
(default 1,024: ``MaxConnections`` is then 1,024 - 512 = 512). A stranger, from
``--sources`` loopback addresses (127.0.0.2, ...: ``MaxHandshakesPerAddress`` is per
address), holds ``--idle`` connections to each port that send nothing (on the TLS port a
stalled ClientHello) and ``--drip`` that send their request (an HTTP request, a TLS
ClientHello, an MQTT CONNECT) one byte every half second; whatever the server closes he
opens again, at most ``--rate`` new connections a second per port. Meanwhile legitimate
clients try, in turn, every ``--every`` seconds, on each port: WebSocket + ``connect`` +
``subscribe`` (plain and TLS) or MQTT CONNECT + SUBSCRIBE, and count as served once
they received the subject's snapshot (published retained before the attack).

Counts, not timings: attempts and served per port during the attack, and the longest
run of consecutive failures. JSON on stdout.

    .venv/bin/python benchmarks/client_port_slowloris.py [--seconds 20] [--files 1024]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import resource
import selectors
import signal
import socket
import ssl
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import trustme

from migratory.protocol import ops
from migratory.protocol import websocket as ws
from migratory.protocol.http import check_handshake_response, handshake_request, new_websocket_key

SUBJECT = "/bench/loris"
CONTENT = b"snapshot-for-the-legitimate"
DRIP_SECONDS = 0.5
LEGIT_TIMEOUT = 2.0  # a legitimate client gives up after this long (then it counts failed)


def mqtt_packet(kind: int, body: bytes) -> bytes:
    size, length = len(body), b""
    while True:
        byte, size = size & 0x7F, size >> 7
        length += bytes([byte | (0x80 if size else 0)])
        if not size:
            return bytes([kind]) + length + body


def mqtt_str(text: str) -> bytes:
    raw = text.encode()
    return len(raw).to_bytes(2, "big") + raw


def mqtt_connect(client: str) -> bytes:
    return mqtt_packet(0x10, mqtt_str("MQTT") + bytes([4, 0x02]) + (60).to_bytes(2, "big")
                       + mqtt_str(client))


def client_hello(tls: ssl.SSLContext) -> bytes:
    """The bytes of a TLS ClientHello (to drip or to stall in)."""
    incoming, outgoing = ssl.MemoryBIO(), ssl.MemoryBIO()
    obj = tls.wrap_bio(incoming, outgoing, server_hostname="localhost")
    with contextlib.suppress(ssl.SSLWantReadError):
        obj.do_handshake()
    return outgoing.read()


@dataclass(eq=False)
class Attacker(threading.Thread):
    """Keeps ``idle`` + ``drip`` connections open to one port, from several addresses."""

    port: int
    request: bytes
    idle: int
    drip: int
    sources: list[str]
    stalled_prefix: bytes = b""  # what an idle connection sends at once (TLS: 5 bytes)
    rate: float = 0.0  # connections opened per second at most (0: as fast as it can)
    stop: threading.Event = field(default_factory=threading.Event)
    opened: int = 0
    closed_by_server: int = 0

    def __post_init__(self) -> None:
        threading.Thread.__init__(self, daemon=True)

    def _open(self, index: int) -> socket.socket | None:
        sock = socket.socket()
        sock.setblocking(False)
        try:
            sock.bind((self.sources[index % len(self.sources)], 0))
            sock.connect_ex(("127.0.0.1", self.port))
        except OSError:
            sock.close()
            return None
        self.opened += 1
        return sock

    def run(self) -> None:
        selector = selectors.DefaultSelector()
        held: dict[int, tuple[socket.socket, int]] = {}  # slot -> (socket, bytes sent)
        slots = self.idle + self.drip
        next_drip = started = time.monotonic()
        while not self.stop.is_set():
            allowed = self.rate * (time.monotonic() - started) + slots if self.rate else 1e18
            for slot in range(slots):  # (re)open what is missing, within the rate
                if slot not in held and self.opened < allowed:
                    sock = self._open(slot)
                    if sock is None:
                        break
                    held[slot] = (sock, 0)
                    selector.register(sock, selectors.EVENT_READ, slot)
            for key, _ in selector.select(timeout=0.05):
                slot = key.data
                sock = held[slot][0]
                try:
                    data = sock.recv(4096)
                except BlockingIOError:
                    continue
                except OSError:
                    data = b""
                if not data:  # closed (or refused, answered) by the server: open again
                    selector.unregister(sock)
                    sock.close()
                    del held[slot]
                    self.closed_by_server += 1
            if time.monotonic() >= next_drip:
                next_drip += DRIP_SECONDS
                for slot, (sock, sent) in list(held.items()):
                    if slot < self.idle:
                        chunk = self.stalled_prefix[sent:]
                    else:
                        chunk = self.request[sent % len(self.request):][:1]
                    if chunk:
                        with contextlib.suppress(OSError):
                            held[slot] = (sock, sent + sock.send(chunk))
        for sock, _ in held.values():
            sock.close()


def websocket_client(port: int, tls: ssl.SSLContext | None, timeout: float) -> bool:
    """WebSocket upgrade, ``connect``, ``subscribe``: True once the snapshot arrived."""
    deadline = time.monotonic() + timeout
    try:
        raw = socket.create_connection(("127.0.0.1", port), timeout=timeout)
        sock = raw if tls is None else tls.wrap_socket(raw, server_hostname="localhost")
        with sock:
            key = new_websocket_key()
            sock.sendall(handshake_request("127.0.0.1", "/", key))
            buf = b""
            decoder = ws.FrameDecoder(client_frames=False, max_message_size=1 << 20)
            while True:
                sock.settimeout(max(0.01, deadline - time.monotonic()))
                chunk = sock.recv(65536)
                if not chunk:
                    return False
                buf += chunk
                used = check_handshake_response(buf, key)
                if used is not None:
                    decoder.receive_data(buf[used:])
                    break
            for op in (ops.Connect(client="legit"),
                       ops.Subscribe((ops.SubscriptionRequest(SUBJECT),))):
                sock.sendall(ws.encode_masked_binary(ops.encode_client_op(op), os.urandom(4)))
            while True:
                event = decoder.next_event()
                if event is None:
                    sock.settimeout(max(0.01, deadline - time.monotonic()))
                    chunk = sock.recv(65536)
                    if not chunk:
                        return False
                    decoder.receive_data(chunk)
                    continue
                if isinstance(event, ws.BinaryMessage):
                    op = ops.decode_server_op(event.data)
                    if isinstance(op, ops.Deliver) and any(
                        m.content == CONTENT for m in op.messages
                    ):
                        return True
    except Exception:  # refused (503), closed, timed out: not served
        return False


def mqtt_client(port: int, timeout: float, tls: ssl.SSLContext | None = None) -> bool:
    """CONNECT, SUBSCRIBE: True once the retained PUBLISH arrived."""
    try:
        raw = socket.create_connection(("127.0.0.1", port), timeout=timeout)
        sock = raw if tls is None else tls.wrap_socket(raw, server_hostname="localhost")
        with sock:
            sock.sendall(mqtt_connect(f"legit{time.monotonic_ns()}"))
            topic = mqtt_str(SUBJECT[1:])
            sock.sendall(mqtt_packet(0x82, (1).to_bytes(2, "big") + topic + b"\x00"))
            deadline, buf = time.monotonic() + timeout, b""
            while time.monotonic() < deadline:
                sock.settimeout(max(0.01, deadline - time.monotonic()))
                chunk = sock.recv(65536)
                if not chunk:
                    return False
                buf += chunk
                if CONTENT in buf:
                    return True
    except (OSError, ValueError):
        pass
    return False


@dataclass
class Tally:
    attempts: int = 0
    served: int = 0
    longest_failing_run: int = 0
    _run: int = 0

    def add(self, ok: bool) -> None:
        self.attempts += 1
        if ok:
            self.served += 1
            self._run = 0
        else:
            self._run += 1
            self.longest_failing_run = max(self.longest_failing_run, self._run)


def start_server(
    files: int, certificate: Path, key: Path, log: Path, settings: dict[str, str] | None = None
) -> tuple[subprocess.Popen[bytes], dict[str, int]]:
    """The server and its ports by scheme (ws, wss, mqtt; mqtts if ``settings`` has
    ListenMqttEncrypted); ``settings``: more ``--set KEY=VALUE``."""
    def limited() -> None:
        resource.setrlimit(resource.RLIMIT_NOFILE, (files, files))

    args = [sys.executable, "-m", "cluster.cli", "serve",
            "--set", "Listen=127.0.0.1:0", "--set", "ListenEncrypted=127.0.0.1:0",
            "--set", "ListenMqtt=127.0.0.1:0", "--set", f"TlsCertificate={certificate}",
            "--set", f"TlsKey={key}"]
    for name, value in (settings or {}).items():
        args += ["--set", f"{name}={value}"]
    wanted = 4 if "ListenMqttEncrypted" in (settings or {}) else 3
    proc = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=log.open("wb"),
                            stdin=subprocess.DEVNULL, preexec_fn=limited,
                            start_new_session=True, cwd=Path(__file__).resolve().parent.parent)
    ports: dict[str, int] = {}
    assert proc.stdout is not None
    deadline = time.monotonic() + 30
    while len(ports) < wanted and time.monotonic() < deadline:
        line = proc.stdout.readline().decode()
        if not line:
            break
        if line.startswith("listening "):
            url = line.split()[1]
            ports[url.split(":", 1)[0]] = int(url.rsplit(":", 1)[1].split("/")[0])
    if len(ports) < wanted:
        proc.kill()
        raise SystemExit(f"server did not start: {ports} (log {log})")
    return proc, ports


def publish_snapshot(port: int) -> None:
    with socket.create_connection(("127.0.0.1", port), timeout=5) as sock:
        sock.sendall(mqtt_connect("publisher"))
        sock.recv(4)  # CONNACK
        body = mqtt_str(SUBJECT[1:]) + CONTENT
        sock.sendall(mqtt_packet(0x31, body) + b"\xe0\x00")  # PUBLISH retain, DISCONNECT
        time.sleep(0.2)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--seconds", type=float, default=20.0, help="attack duration")
    parser.add_argument("--files", type=int, default=1024, help="server RLIMIT_NOFILE")
    parser.add_argument("--idle", type=int, default=300, help="idle connections per port")
    parser.add_argument("--drip", type=int, default=100, help="slow-drip connections per port")
    parser.add_argument("--sources", type=int, default=20, help="loopback source addresses")
    parser.add_argument("--rate", type=float, default=200.0,
                        help="new connections per second per port at most, after the first "
                        "idle+drip (0: as fast as the stranger can)")
    parser.add_argument("--every", type=float, default=0.25, help="legitimate attempt period")
    args = parser.parse_args()
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    work = Path(tempfile.mkdtemp(prefix="slowloris-"))
    ca = trustme.CA()
    cert = ca.issue_cert("localhost", "127.0.0.1")
    cert.private_key_pem.write_to_path(str(work / "key.pem"))
    cert.cert_chain_pems[0].write_to_path(str(work / "cert.pem"))
    client_tls = ssl.create_default_context()
    ca.configure_trust(client_tls)
    proc, ports = start_server(args.files, work / "cert.pem", work / "key.pem",
                               work / "server.log")
    result: dict[str, Any] = {"files": args.files, "seconds": args.seconds,
                              "idle_per_port": args.idle, "drip_per_port": args.drip,
                              "sources": args.sources, "rate_per_port": args.rate}
    try:
        publish_snapshot(ports["mqtt"])
        checks = {
            "ws": lambda: websocket_client(ports["ws"], None, LEGIT_TIMEOUT),
            "wss": lambda: websocket_client(ports["wss"], client_tls, LEGIT_TIMEOUT),
            "mqtt": lambda: mqtt_client(ports["mqtt"], LEGIT_TIMEOUT),
        }
        result["before_attack"] = {name: check() for name, check in checks.items()}
        sources = [f"127.0.0.{i + 2}" for i in range(args.sources)]
        hello = client_hello(client_tls)
        attackers = [
            Attacker(ports["ws"], b"GET /snapshot?subject=/bench/loris HTTP/1.1\r\n",
                     args.idle, args.drip, sources, rate=args.rate),
            Attacker(ports["wss"], hello, args.idle, args.drip, sources,
                     stalled_prefix=hello[:5], rate=args.rate),
            Attacker(ports["mqtt"], mqtt_connect("loris"), args.idle, args.drip, sources,
                     rate=args.rate),
        ]
        for attacker in attackers:
            attacker.start()
        time.sleep(1.0)  # the flood is in place
        tallies = {name: Tally() for name in checks}
        end = time.monotonic() + args.seconds
        while time.monotonic() < end:
            for name, check in checks.items():
                tallies[name].add(check())
            time.sleep(args.every)
        for attacker in attackers:
            attacker.stop.set()
        for attacker in attackers:
            attacker.join(5)
        result["during_attack"] = {
            name: {"attempts": t.attempts, "served": t.served,
                   "longest_failing_run": t.longest_failing_run}
            for name, t in tallies.items()
        }
        result["stranger"] = {
            name: {"opened": a.opened, "closed_by_server": a.closed_by_server}
            for name, a in zip(checks, attackers, strict=True)
        }
        time.sleep(1.0)
        result["after_attack"] = {name: check() for name, check in checks.items()}
        result["server_alive"] = proc.poll() is None
    finally:
        proc.send_signal(signal.SIGINT)
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
    result["server_log"] = str(work / "server.log")
    print(json.dumps(result, indent=1))
    return 0 if result.get("server_alive") else 1


if __name__ == "__main__":
    sys.exit(main())
