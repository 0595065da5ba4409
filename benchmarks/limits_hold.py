"""Client-driven exhaustion that the server's limits hold, checked against one server
process started here (127.0.0.1) each; bytes and counts, not timings::

    .venv/bin/python benchmarks/limits_hold.py slow-subscribers [--subscribers 300] [--set K=V]
    .venv/bin/python benchmarks/limits_hold.py subscribe-flood
    .venv/bin/python benchmarks/limits_hold.py ack-flood [--publishes 300000]
    .venv/bin/python benchmarks/limits_hold.py one-off-subjects [--subjects 300000]
    .venv/bin/python benchmarks/limits_hold.py descriptors
    .venv/bin/python benchmarks/limits_hold.py snapshot-fields   # half held (h11's checks)

slow-subscribers: subscribers that never read (receive buffer 4 KiB) of one subject and a
publisher of 120 KB messages: RSS, slow consumers cut off (4500), outbox bytes.
subscribe-flood: one subscribe of 100,000 and of 30,000 entries, then 100 subscribes of
1,000 on one connection. ack-flood: publishes with closures, never reading the statuses.
one-off-subjects: a new subject per publish, RSS per subject. descriptors: the server's
open-file limit lowered to 200 (prlimit) and 400 connections opened: CPU at EMFILE, a
bystander, a client connecting after. Each prints one JSON line; docs/benchmarks.md,
"Holding the server at its limits".
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).parents[1] / "tests" / "server"))
sys.path.insert(0, str(Path(__file__).parent))

from attacks import Server
from bystander import Bystander
from rawclient import RawClient

from migratory.model.message import Message
from migratory.protocol import ops
from migratory.protocol import websocket as ws


def cpu_seconds(pid: int) -> float:
    with open(f"/proc/{pid}/stat") as stat:
        fields = stat.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def round_trip(client: RawClient) -> list[ops.ServerOp]:
    client.send_op(ops.Ping(1))
    seen = []
    while not isinstance(op := client.recv_op(), ops.Pong):
        seen.append(op)
    return seen


def slow_subscribers(server: Server, args: argparse.Namespace) -> dict[str, Any]:
    subscribers = []  # kept open: a client collected would close its socket
    for i in range(args.subscribers):
        client = RawClient(server.port, timeout=30)
        client.connect(f"s{i}")
        client.sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        client.subscribe("/Amp/x")
        subscribers.append(client)
    publisher = RawClient(server.port, timeout=60)
    publisher.connect("publisher")
    before, peak = server.rss(), 0
    for i in range(args.messages):
        publisher.send_op(ops.Publish(Message("/Amp/x", b"x" * 120_000)))
        if i % 20 == 19:
            round_trip(publisher)
            peak = max(peak, server.rss())
    time.sleep(2)
    stats = server.stats()
    return {"rss_before_kib": before, "rss_peak_kib": max(peak, server.rss()),
            "slow_consumers": stats["slow_consumers"], "outbox_bytes": stats["outbox_bytes"],
            "subscribers": len(subscribers)}


def subscribe_flood(server: Server, args: argparse.Namespace) -> dict[str, Any]:
    figures: dict[str, Any] = {}
    for count in (100_000, 30_000):
        client = RawClient(server.port, timeout=30)
        client.connect("one")
        payload = ops.encode_client_op(ops.Subscribe(tuple(
            ops.SubscriptionRequest(f"/S/x{i}") for i in range(count))))
        client.send_payload(payload)
        while not isinstance(event := client.recv_event(), ws.CloseReceived):
            pass
        figures[f"one_of_{count}"] = {"frame_bytes": len(payload),
                                      "close": f"{event.code} {event.reason}"}
    client = RawClient(server.port, timeout=60)
    client.connect("many")
    before = server.rss()
    for k in range(100):
        client.send_op(ops.Subscribe(tuple(
            ops.SubscriptionRequest(f"/S/y{k}_{i}") for i in range(1000))))
    answers: dict[str, int] = {}
    while sum(answers.values()) < 100_000:
        op = client.recv_op()
        if isinstance(op, ops.SubjectStatus):
            key = op.status.value if op.reason is None else f"{op.status.value}: {op.reason}"
            answers[key] = answers.get(key, 0) + 1
    figures["many"] = {"answers": answers, "rss_grown_kib": server.rss() - before}
    return figures


def ack_flood(server: Server, args: argparse.Namespace) -> dict[str, Any]:
    client = RawClient(server.port, timeout=10)
    client.connect("publisher")
    client.sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    frames = b"".join(ws.encode_masked_binary(ops.encode_client_op(ops.Publish(
        Message(f"/Ack/s{i % 100}", b"x" * 10, closure=f"c{i}"))), b"abcd") for i in range(1000))
    before, sent, error = server.rss(), 0, None
    try:
        while sent < args.publishes:
            client.sock.sendall(frames)
            sent += 1000
    except OSError as exc:
        error = repr(exc)
    time.sleep(2)
    stats = server.stats()
    return {"sent": sent, "error": error, "slow_consumers": stats["slow_consumers"],
            "rss_grown_kib": server.rss() - before, "outbox_bytes": stats["outbox_bytes"]}


def one_off_subjects(server: Server, args: argparse.Namespace) -> dict[str, Any]:
    client = RawClient(server.port, timeout=120)
    client.connect("publisher")
    before = server.rss()
    for i in range(args.subjects):
        client.send_op(ops.Publish(Message(f"/OneOff/s{i}", b"x" * 10)))
        if i % 5000 == 4999:
            round_trip(client)
    round_trip(client)
    subjects = server.stats()["subjects"]
    grown = server.rss() - before
    return {"subjects": subjects, "rss_grown_kib": grown,
            "bytes_per_subject": round(grown * 1024 / max(subjects, 1))}


def descriptors(server: Server, args: argparse.Namespace) -> dict[str, Any]:
    subprocess.run(["prlimit", f"--pid={server.proc.pid}", "--nofile=200:200"], check=True)
    held = []
    for _ in range(400):
        sock = socket.socket()
        sock.setblocking(False)
        sock.connect_ex(("127.0.0.1", server.port))
        held.append(sock)
    time.sleep(1)
    cpu = cpu_seconds(server.proc.pid)
    time.sleep(5)
    cpu = cpu_seconds(server.proc.pid) - cpu
    open_fds = len(os.listdir(f"/proc/{server.proc.pid}/fd"))
    for sock in held:
        sock.close()
    time.sleep(2)
    RawClient(server.port, timeout=10).connect("after")
    return {"server_fds": open_fds, "cpu_s_in_5_s_at_the_limit": round(cpu, 2),
            "connected_after": True}


def snapshot_fields(server: Server, args: argparse.Namespace) -> dict[str, Any]:
    """50 keep-alive connections asking GET /snapshot, for 5 s, of a subject whose
    snapshot has 20,000 fields (its X-Migratory-Fields header ~240 KB, encoded once per
    snapshot, checked by h11 again for every response). Since, a raw reply's fields are
    at most 8 KiB (http_routes.FIELDS_HEADER_BYTES): these are answered 406."""
    publisher = RawClient(server.port, timeout=60)
    publisher.connect("publisher")
    publisher.send_op(ops.Publish(Message(
        "/Snap/x", b"", {f"{i:04x}": "" for i in range(20_000)}, retained=True)))
    round_trip(publisher)
    held = [socket.create_connection(("127.0.0.1", server.port)) for _ in range(50)]
    request = b"GET /snapshot?subject=/Snap/x HTTP/1.1\r\nHost: x\r\n\r\n"
    cpu, started, answered = cpu_seconds(server.proc.pid), time.monotonic(), 0
    while time.monotonic() - started < 5:
        for sock in held:
            sock.sendall(request)
        for sock in held:
            head = b""
            while b"\r\n\r\n" not in head:
                head += sock.recv(1 << 20)
            answered += 1
    cpu = cpu_seconds(server.proc.pid) - cpu
    return {"requests": answered, "server_cpu_ms_per_request": round(cpu / answered * 1000, 2)}


CHECKS = {"snapshot-fields": snapshot_fields, "slow-subscribers": slow_subscribers,
          "subscribe-flood": subscribe_flood, "ack-flood": ack_flood,
          "one-off-subjects": one_off_subjects, "descriptors": descriptors}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("check", choices=sorted(CHECKS))
    parser.add_argument("--subscribers", type=int, default=300)
    parser.add_argument("--messages", type=int, default=400)
    parser.add_argument("--publishes", type=int, default=300_000)
    parser.add_argument("--subjects", type=int, default=300_000)
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE")
    args = parser.parse_args()
    settings = {"MaxConnectionRatePerAddress": "0", "MaxPublishesPerSecond": "0",
                "MaxHandshakesPerAddress": "0", **dict(s.split("=", 1) for s in args.set)}
    server = Server(**settings)
    try:
        bystander = Bystander(server.port)
        figures = CHECKS[args.check](server, args)
        delays = bystander.stop()
        gaps = server.stats()["loop_gaps"]
        print(json.dumps({"check": args.check, "settings": settings, **figures,
                          "bystander_max_ms": delays["max_ms"], "bystander_lost": delays["lost"],
                          "loop_gap_max_ms": gaps["max_ms"],
                          "longest_gap_parts_ms": gaps.get("longest_gap_parts_ms")}))
    finally:
        server.stop()


if __name__ == "__main__":
    main()
