"""Conflated subscribers of one subject and a publisher of messages of many fields: what
the server pays per publish (one server process started here, on 127.0.0.1).

``--subscribers`` connections each subscribe to /C/x with ``--period`` ms of conflation
(and do not read); a publisher then sends ``--messages`` messages of ``--fields`` fields
(4-character names, empty values: ~3.8 bytes a field by MaxMessageSize's count), one
after another's round trip, ``--gap`` seconds apart. Reported: the publishing time, the
server's CPU seconds, its longest event-loop gap (``/stats``), a bystander client's
largest delay (publishing to itself every 20 ms, tests/server/bystander.py), and RSS::

    .venv/bin/python benchmarks/conflation_fields.py                      # 200 x 1 h periods
    .venv/bin/python benchmarks/conflation_fields.py --period 100 --gap 0.1 --messages 30

Figures depend on the machine's load (``uptime``): docs/benchmarks.md, "Conflation merged
each field once per subscriber".
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parents[1] / "tests" / "server"))
sys.path.insert(0, str(Path(__file__).parent))

from attacks import Server
from bystander import Bystander
from rawclient import RawClient

from migratory.model.message import Message
from migratory.protocol import ops


def cpu_seconds(pid: int) -> float:
    with open(f"/proc/{pid}/stat") as stat:
        fields = stat.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--subscribers", type=int, default=200)
    parser.add_argument("--period", type=int, default=3_600_000, help="conflation ms")
    parser.add_argument("--messages", type=int, default=10)
    parser.add_argument("--fields", type=int, default=20_000)
    parser.add_argument("--gap", type=float, default=0.0, help="seconds between publishes")
    args = parser.parse_args()
    server = Server(MaxConnectionRatePerAddress="0")
    try:
        subscribers = []
        for i in range(args.subscribers):
            client = RawClient(server.port, timeout=30)
            client.connect(f"s{i}")
            client.sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 1 << 20)
            client.send_op(ops.Subscribe(
                (ops.SubscriptionRequest("/C/x", conflation_ms=args.period),)))
            subscribers.append(client)
        time.sleep(1)
        rss_before, cpu_before = server.rss(), cpu_seconds(server.proc.pid)
        bystander = Bystander(server.port)
        publisher = RawClient(server.port, timeout=300)
        publisher.connect("publisher")
        started = time.monotonic()
        for i in range(args.messages):
            fields = {f"{i % 16:x}{n:03x}": "" for n in range(args.fields)}
            publisher.send_op(ops.Publish(Message("/C/x", b"", fields)))
            publisher.send_op(ops.Ping(1))
            while not isinstance(publisher.recv_op(), ops.Pong):
                pass
            time.sleep(args.gap)
        elapsed = time.monotonic() - started
        delays = bystander.stop()
        stats = server.stats()
        print(json.dumps({
            "subscribers": args.subscribers, "period_ms": args.period,
            "messages": args.messages, "fields": args.fields,
            "publishing_s": round(elapsed, 2),
            "server_cpu_s": round(cpu_seconds(server.proc.pid) - cpu_before, 2),
            "loop_gap_max_ms": stats["loop_gaps"]["max_ms"],
            "bystander_max_ms": delays["max_ms"],
            "rss_grown_kib": server.rss() - rss_before,
        }))
    finally:
        server.stop()


if __name__ == "__main__":
    main()
