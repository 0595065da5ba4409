"""The attacks of issue 14, as the issue measured them, against one server process:
for each, the bystander's delay (a client in its own process publishing to itself every
20 ms), the server's RSS before / at the peak / after, and how the attacker was refused.

    .venv/bin/python benchmarks/attacks.py [--only NAME ...]

Figures depend on the machine's load: run it on a quiet machine (``uptime``).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import resource
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).parents[1] / "tests" / "server"))

from bystander import Bystander, rss_kib
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


ATTACKS: dict[str, Callable[[], dict[str, Any]]] = {
    "amplification-18kb": lambda: amplification(18),
    "amplification-30kb": lambda: amplification(30),
    "amplification-60kb": lambda: amplification(60),
    "empty-fragments-100mb": empty_fragments,
    "partial-frames-200": partial_frames,
    "pending-handshakes-15000": pending_handshakes,
    "one-off-subjects-200000": one_off_subjects,
}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--only", nargs="*", choices=sorted(ATTACKS))
    args = parser.parse_args()
    _, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    print(f"load average {os.getloadavg()}", flush=True)
    for name in args.only or ATTACKS:
        print(name, json.dumps(ATTACKS[name](), sort_keys=True), flush=True)
    print(f"load average {os.getloadavg()}", flush=True)


if __name__ == "__main__":
    main()
