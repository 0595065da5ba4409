"""The attacks of issue 14, as the issue measured them, against one server process:
for each, the bystander's delay (a client in its own process publishing to itself every
20 ms), the server's RSS before / at the peak / after, and how the attacker was refused.
``connection-flood`` and ``hello-flood`` instead count the legitimate TLS clients served
during a flood of cheap connections (:func:`connection_flood`), ``cluster-link-flood``
the links a member makes to another during such a flood (:func:`cluster_link_flood`).

    .venv/bin/python benchmarks/attacks.py [--only NAME ...] [--set KEY=VALUE ...]

Figures depend on the machine's load: run it on a quiet machine (``uptime``).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import multiprocessing
import os
import resource
import signal
import socket
import ssl
import struct
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).parents[1] / "tests" / "server"))

import trustme
from bystander import Bystander, rss_kib
from client_port_slowloris import (
    client_hello,
    mqtt_client,
    publish_snapshot,
    start_server,
    websocket_client,
)
from rawclient import RawClient

from migratory.model.message import Message
from migratory.protocol import ops
from migratory.protocol import websocket as ws
from migratory.protocol.http import handshake_request, new_websocket_key

MASK = b"abcd"


class Server:
    def __init__(self, **settings: str) -> None:
        args = [sys.executable, "-m", "cluster", "serve", "--set", "Listen=127.0.0.1:0"]
        for key, value in settings.items():
            args += ["--set", f"{key}={value}"]
        self.proc = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
        assert self.proc.stdout is not None
        self.port = int(self.proc.stdout.readline().decode().rsplit(":", 1)[1])

    def stats(self) -> dict[str, Any]:
        with urllib.request.urlopen(f"http://127.0.0.1:{self.port}/stats", timeout=30) as r:
            result: dict[str, Any] = json.loads(r.read())
            return result

    def rss(self) -> int:
        return rss_kib(self.proc.pid)

    def stop(self) -> None:
        self.proc.terminate()
        self.proc.wait(10)


def measured(server: Server, attack: Callable[[dict[str, Any]], None], settle: float = 3.0,
             token: str | None = None) -> dict[str, Any]:
    figures: dict[str, Any] = {"rss_before_kib": server.rss()}
    bystander = Bystander(server.port, token)
    peak = [figures["rss_before_kib"]]
    attack(figures)
    peak.append(server.rss())
    result = bystander.stop()
    time.sleep(settle)
    with contextlib.suppress(OSError, ValueError):  # the server's own longest loop gap
        figures["server_loop_gap_max_ms"] = server.stats()["loop_gaps"]["max_ms"]
    figures.update(
        bystander_p50_ms=result["p50_ms"], bystander_max_ms=result["max_ms"],
        bystander_lost=result["lost"], rss_peak_kib=max([*peak, figures.get("rss_peak_kib", 0)]),
        rss_after_kib=server.rss(),
    )
    return figures


def amplification(size_kb: int) -> dict[str, Any]:
    server = Server(Entitlement="Basic", EntitlementAllowToken="secret")
    try:
        filler = RawClient(server.port, timeout=60)
        filler.connect("filler", token="secret")
        subjects = [f"/Amp/S{i}" for i in range(3)]
        for subject in subjects:
            for _ in range(1000):
                filler.send_op(ops.Publish(Message(subject, b"h" * 1000)))
        filler.send_op(ops.Ping(1))
        while not isinstance(filler.recv_op(), ops.Pong):
            pass

        def attack(figures: dict[str, Any]) -> None:
            entries = []
            payload = b""
            while len(payload) < size_kb * 1000:
                entries.append(ops.SubscriptionRequest(subjects[len(entries) % 3], history=1000))
                if len(entries) % 50 == 0:
                    payload = ops.encode_client_op(ops.Subscribe(tuple(entries)))
            attacker = RawClient(server.port, timeout=60)
            attacker.connect("anonymous")
            started = time.monotonic()
            attacker.send_payload(payload)
            denied = 0
            for _ in entries:
                event = attacker.recv_event()
                if isinstance(event, ws.CloseReceived):
                    figures["closed"] = f"{event.code} {event.reason}"
                    break
                answer = ops.decode_server_op(event.data)  # type: ignore[union-attr]
                denied += isinstance(answer, ops.SubjectStatus) and (
                    answer.status is ops.Status.SUBSCRIBE_DENY
                )
            figures.update(
                frame_bytes=len(payload), entries=len(entries), denied=denied,
                answered_in_ms=round((time.monotonic() - started) * 1000, 1),
            )
            time.sleep(1)

        return measured(server, attack, token="secret")
    finally:
        server.stop()


def empty_fragments() -> dict[str, Any]:
    server = Server()
    try:
        def attack(figures: dict[str, Any]) -> None:
            client = RawClient(server.port, timeout=10)
            client.connect("fragments")
            chunk = ws.encode_frame(ws.CONTINUATION, b"", fin=False, mask=MASK) * 10_000
            client.send_raw(ws.encode_frame(ws.BINARY, b"", fin=False, mask=MASK))
            sent = 0
            try:
                while sent < 100_000_000:
                    client.send_raw(chunk)
                    sent += len(chunk)
            except OSError:
                pass
            figures["bytes_sent_before_refused"] = sent
            try:
                figures["close_code"] = client.recv_close(timeout=5).code
            except (OSError, TimeoutError) as exc:
                figures["close_code"] = repr(exc)

        return measured(server, attack)
    finally:
        server.stop()


def partial_frames(count: int = 200) -> dict[str, Any]:
    server = Server(MaxHandshakesPerAddress="0")
    try:
        def attack(figures: dict[str, Any]) -> None:
            held = []
            length = (1 << 20) - 1
            for _ in range(count):
                sock = socket.create_connection(("127.0.0.1", server.port), timeout=10)
                sock.sendall(handshake_request("127.0.0.1", "/", new_websocket_key()))
                head = b""
                while b"\r\n\r\n" not in head:
                    head += sock.recv(4096)
                connect = ws.encode_masked_binary(ops.encode_client_op(ops.Connect("p")), MASK)
                header = ws.encode_frame(ws.BINARY, b"\0" * length, mask=MASK)[:-length]
                sock.sendall(connect + header + b"\0" * (length - 1))
                held.append(sock)
            time.sleep(1)
            figures["rss_peak_kib"] = server.rss()
            for sock in held:
                sock.close()

        return measured(server, attack)
    finally:
        server.stop()


def pending_handshakes(count: int = 15_000) -> dict[str, Any]:
    server = Server()
    try:
        def attack(figures: dict[str, Any]) -> None:
            socks = []
            for _ in range(count):
                try:
                    socks.append(socket.create_connection(("127.0.0.1", server.port), timeout=5))
                except OSError as exc:
                    figures["connect_error"] = repr(exc)
                    break
            time.sleep(1)
            figures["rss_peak_kib"] = server.rss()
            figures["held"] = len(socks)
            for sock in socks:
                sock.close()
            time.sleep(0.5)
            figures["refused"] = server.stats()["connections_refused"]  # (refused too, before)

        return measured(server, attack)
    finally:
        server.stop()


def one_off_subjects(count: int = 200_000) -> dict[str, Any]:
    server = Server(CacheExpireTime="5")
    try:
        def attack(figures: dict[str, Any]) -> None:
            client = RawClient(server.port, timeout=60)
            client.connect("one-off")
            for i in range(count):
                client.send_op(ops.Publish(Message(f"/OneOff/s{i}", b"x" * 100)))
            client.send_op(ops.Ping(1))
            while not isinstance(client.recv_op(), ops.Pong):
                pass
            figures["subjects_at_peak"] = server.stats()["subjects"]
            figures["rss_peak_kib"] = server.rss()

        figures = measured(server, attack, settle=20.0)
        figures["subjects_after"] = server.stats()["subjects"]
        return figures
    finally:
        server.stop()


FLOOD_SECONDS = 10.0
FLOOD_PROCESSES = 2
FLOOD_THREADS = 12  # per process: blocking connects, so a full backlog holds only one
LEGIT_TIMEOUT = 3.0  # a legitimate client gives up after this long: not served
LEGIT_EVERY = 0.1


def _flood_thread(port: int, source: str, deadline: float, counts: list[int],
                  payload: bytes) -> None:
    linger = struct.pack("ii", 1, 0)  # closed with a reset: no TIME_WAIT to run out of ports
    while time.monotonic() < deadline:
        sock = socket.socket(socket.AF_INET6 if ":" in source else socket.AF_INET)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, linger)
        sock.settimeout(1.0)
        try:
            sock.bind((source, 0))
            sock.connect(("::1" if ":" in source else "127.0.0.1", port))
            sock.send(payload)
            counts[0] += 1
        except OSError:
            counts[1] += 1
        finally:
            sock.close()


def _flood(port: int, sources: list[str], seconds: float, payload: bytes, out: Any) -> None:
    """One attacking process: FLOOD_THREADS threads that connect (each from one of
    ``sources``, the first thread from the first), send ``payload`` and reset, as fast
    as the server takes them, for ``seconds``; puts [connections, failures] to ``out``."""
    deadline = time.monotonic() + seconds
    counts = [[0, 0] for _ in range(FLOOD_THREADS)]
    threads = [threading.Thread(target=_flood_thread,
                                args=(port, sources[n * FLOOD_PROCESSES % len(sources)],
                                      deadline, c, payload))
               for n, c in enumerate(counts)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(seconds + 5)
    out.put([sum(c[0] for c in counts), sum(c[1] for c in counts)])


def cpu_seconds(pid: int) -> float:
    """User + system CPU seconds of process ``pid`` so far."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _legitimate(checks: dict[str, Callable[[], bool]], seconds: float) -> dict[str, Any]:
    """Tries each of ``checks`` in turn, then sleeps LEGIT_EVERY s, for ``seconds``: per
    check, served of attempted and the latency (connect to snapshot) of those served."""
    latencies: dict[str, list[float]] = {name: [] for name in checks}
    attempts = 0
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        attempts += 1
        for name, check in checks.items():
            started = time.monotonic()
            if check():
                latencies[name].append(time.monotonic() - started)
        time.sleep(LEGIT_EVERY)
    figures: dict[str, Any] = {}
    for name, served in latencies.items():
        ms = sorted(round(x * 1000, 1) for x in served)
        figures[name] = {"attempts": attempts, "served": len(ms),
                         "p50_ms": ms[len(ms) // 2] if ms else None,
                         "max_ms": ms[-1] if ms else None}
    return figures


def connection_flood(settings: dict[str, str], seconds: float = FLOOD_SECONDS,
                     sources: int = 1, hello: bool = False) -> dict[str, Any]:
    """A flood of cheap connections -- connect, 64 bytes (garbage, or with ``hello`` a
    TLS ClientHello: the server's key exchange and signature for nothing), reset --
    from ``sources`` addresses (127.0.0.2, ...) to the ``ListenEncrypted`` port, as fast
    as the server takes them, while legitimate clients from 127.0.0.1 try a TLS
    WebSocket session (wss: upgrade, ``connect``, ``subscribe``, its snapshot) and an
    MQTT session over TLS (mqtts: CONNECT, SUBSCRIBE, the retained message) in turn,
    each given LEGIT_TIMEOUT s. Quiet, then flooded: served of attempted and their
    latency; the flood's connections, the server's CPU seconds, its refusals and log."""
    work = Path(tempfile.mkdtemp(prefix="flood-"))
    ca = trustme.CA()
    cert = ca.issue_cert("localhost", "127.0.0.1")
    cert.private_key_pem.write_to_path(str(work / "key.pem"))
    cert.cert_chain_pems[0].write_to_path(str(work / "cert.pem"))
    client_tls = ssl.create_default_context()
    ca.configure_trust(client_tls)
    files = resource.getrlimit(resource.RLIMIT_NOFILE)[1]
    proc, ports = start_server(files, work / "cert.pem", work / "key.pem", work / "server.log",
                               {"ListenMqttEncrypted": "127.0.0.1:0", **settings})
    figures: dict[str, Any] = {"settings": settings, "flood_seconds": seconds,
                               "sources": sources,
                               "payload": "ClientHello" if hello else "garbage",
                               "load_average": os.getloadavg()}

    legitimate: dict[str, Callable[[], bool]] = {
        "wss": lambda: websocket_client(ports["wss"], client_tls, LEGIT_TIMEOUT),
        "mqtts": lambda: mqtt_client(ports["mqtts"], LEGIT_TIMEOUT, client_tls),
    }

    try:
        publish_snapshot(ports["mqtt"])
        figures["quiet"] = _legitimate(legitimate, 2.0)
        out = multiprocessing.get_context("fork").Queue()
        addresses = [f"127.0.0.{2 + n}" for n in range(sources)]
        payload = client_hello(client_tls) if hello else os.urandom(64)
        flooders = [
            multiprocessing.get_context("fork").Process(
                target=_flood,
                args=(ports["wss"], addresses[n:] + addresses[:n], seconds, payload, out))
            for n in range(FLOOD_PROCESSES)
        ]
        for flooder in flooders:
            flooder.start()
        cpu = cpu_seconds(proc.pid)
        time.sleep(0.5)  # the flood is on
        figures["flooded"] = _legitimate(legitimate, seconds - 1.0)
        totals = [out.get(timeout=seconds + 10) for _ in flooders]
        figures["server_cpu_s"] = round(cpu_seconds(proc.pid) - cpu, 2)
        for flooder in flooders:
            flooder.join(10)
        figures["flood_connections"] = sum(t[0] for t in totals)
        figures["flood_failed"] = sum(t[1] for t in totals)
        figures["server_cpu_us_per_flood_connection"] = round(
            figures["server_cpu_s"] / max(1, figures["flood_connections"]) * 1e6, 1)
        figures["server_alive"] = proc.poll() is None
        with urllib.request.urlopen(f"http://127.0.0.1:{ports['ws']}/stats", timeout=30) as r:
            figures["refusals"] = json.loads(r.read())["refusals"]
    finally:
        proc.send_signal(signal.SIGINT)
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
    figures["server_log"] = str(work / "server.log")
    figures["server_log_lines"] = len((work / "server.log").read_bytes().splitlines())
    return figures


def cluster_link_flood(seconds: float = FLOOD_SECONDS, sources: int = 1) -> dict[str, Any]:
    """The ClientHello flood of :func:`connection_flood` at a member's cluster link port
    with ClusterTls* (a Standard member, its one peer absent), while a member with the
    cluster's certificate and password dials it in turn (each link given LEGIT_TIMEOUT
    s): links made of attempted and their latency; the member's CPU per flood
    connection, and its refusals (GET /metrics)."""
    import trio

    from cluster import link
    from cluster.link_io import ClusterTls, connect
    from migratory.certificates import make_cluster_certificates
    from migratory.tls import cluster_contexts

    work = Path(tempfile.mkdtemp(prefix="link-flood-"))
    made = make_cluster_certificates(work, {"m0": ["127.0.0.1"], "m1": ["127.0.0.1"]})
    ports = []
    for _ in range(2):
        with socket.socket() as sock:
            sock.bind(("127.0.0.1", 0))
            ports.append(sock.getsockname()[1])
    member, peer = (f"127.0.0.1:{port}" for port in ports)
    password = "link-flood-password-0123456789"
    server = Server(ClusterDeliveryMode="Standard", ClusterPassword=password,
                    ClusterMembers=f"{member},{peer}", ClusterMemberListen=member,
                    **made["m0"].settings())
    tls = ClusterTls(*cluster_contexts(*(str(f) for f in (made["m1"].certificate,
                                                           made["m1"].key, made["m1"].ca))))

    async def dial() -> bool:
        with trio.move_on_after(LEGIT_TIMEOUT):
            try:
                channel = await connect(("127.0.0.1", ports[0]), member=peer,
                                        password=password, tls=tls, max_frame=link.MAX_FRAME)
            except Exception:  # refused, reset: not linked
                return False
            await channel.aclose()
            return True
        return False

    figures: dict[str, Any] = {"flood_seconds": seconds, "sources": sources,
                               "load_average": os.getloadavg()}
    try:
        link_made: dict[str, Callable[[], bool]] = {"member_link": lambda: trio.run(dial)}
        figures["quiet"] = _legitimate(link_made, 2.0)
        hello = client_hello(ssl.create_default_context())
        out = multiprocessing.get_context("fork").Queue()
        addresses = [f"127.0.0.{2 + n}" for n in range(sources)]
        flooders = [multiprocessing.get_context("fork").Process(
            target=_flood, args=(ports[0], addresses[n:] + addresses[:n], seconds, hello, out))
            for n in range(FLOOD_PROCESSES)]
        for flooder in flooders:
            flooder.start()
        cpu = cpu_seconds(server.proc.pid)
        time.sleep(0.5)
        figures["flooded"] = _legitimate(link_made, seconds - 1.0)
        totals = [out.get(timeout=seconds + 10) for _ in flooders]
        figures["member_cpu_s"] = round(cpu_seconds(server.proc.pid) - cpu, 2)
        for flooder in flooders:
            flooder.join(10)
        figures["flood_connections"] = sum(t[0] for t in totals)
        figures["member_cpu_us_per_flood_connection"] = round(
            figures["member_cpu_s"] / max(1, figures["flood_connections"]) * 1e6, 1)
        with urllib.request.urlopen(f"http://127.0.0.1:{server.port}/metrics", timeout=30) as r:
            figures["refused"] = [line for line in r.read().decode().splitlines()
                                  if line.startswith("migratory_cluster_link_refused_total")]
    finally:
        server.stop()
    return figures


ATTACKS: dict[str, Callable[[], dict[str, Any]]] = {
    "amplification-18kb": lambda: amplification(18),
    "amplification-30kb": lambda: amplification(30),
    "amplification-60kb": lambda: amplification(60),
    "empty-fragments-100mb": empty_fragments,
    "partial-frames-200": partial_frames,
    "pending-handshakes-15000": pending_handshakes,
    "one-off-subjects-200000": one_off_subjects,
    "connection-flood": lambda: connection_flood(SETTINGS, sources=SOURCES[0]),
    "hello-flood": lambda: connection_flood(SETTINGS, sources=SOURCES[0], hello=True),
    "cluster-link-flood": lambda: cluster_link_flood(sources=SOURCES[0]),
}
SETTINGS: dict[str, str] = {}  # --set KEY=VALUE: connection-flood's server
SOURCES = [1]  # --sources: connection-flood's attacking addresses


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--only", nargs="*", choices=sorted(ATTACKS))
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                        help="a setting of the server connection-flood attacks")
    parser.add_argument("--sources", type=int, default=1,
                        help="connection-flood: attacking addresses (up to 24)")
    args = parser.parse_args()
    SOURCES[0] = args.sources
    SETTINGS.update(item.split("=", 1) for item in args.set)
    _, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    print(f"load average {os.getloadavg()}", flush=True)
    for name in args.only or ATTACKS:
        print(name, json.dumps(ATTACKS[name](), sort_keys=True), flush=True)
    print(f"load average {os.getloadavg()}", flush=True)


if __name__ == "__main__":
    main()
