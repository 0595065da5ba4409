"""A thundering herd of resumes: many clients resume the same subjects from the same
position at once (a member's clients coming back after a failover), against one server
process started here, on 127.0.0.1.

The server caches 1,000 messages of 100 bytes on each of 10 subjects; ``--clients``
connections (connected beforehand) then each send one ``subscribe`` resuming the 10
subjects ``--back`` messages back, all at once; one thread reads every answer. Reported:
how long until every client had its 10 DATA_SYNC, the server's CPU seconds meanwhile, its
RSS, its longest event-loop gap and what it was made of (loop CPU, waiting for a core),
and a bystander's largest delay (publishing to itself every 20 ms)::

    .venv/bin/python benchmarks/resume_herd.py --clients 1000 --back 100

docs/benchmarks.md, "A thundering herd of resumes".
"""

from __future__ import annotations

import argparse
import json
import os
import selectors
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
from migratory.model.position import Position
from migratory.protocol import ops
from migratory.protocol import websocket as ws

SUBJECTS = [f"/Herd/s{i}" for i in range(10)]
CACHED = 1000


def cpu_seconds(pid: int) -> float:
    with open(f"/proc/{pid}/stat") as stat:
        fields = stat.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def fill(server: Server) -> int:
    """Cache CACHED messages on each subject; the subjects' epoch."""
    publisher = RawClient(server.port, timeout=60)
    publisher.connect("publisher")
    for subject in SUBJECTS:
        for _ in range(CACHED):
            publisher.send_op(ops.Publish(Message(subject, b"x" * 100)))
    publisher.send_op(ops.Ping(1))
    while not isinstance(publisher.recv_op(), ops.Pong):
        pass
    publisher.send_op(ops.Subscribe((ops.SubscriptionRequest(SUBJECTS[0]),)))
    allow = publisher.recv_op()
    assert isinstance(allow, ops.SubjectStatus) and allow.position is not None
    return allow.position.epoch


def read_until_synced(socks: list[socket.socket], seconds: float,
                      per_client: int = len(SUBJECTS), marker: bytes = b"DATA_SYNC",
                      ) -> tuple[int, int, int, float]:
    """Read every socket until each has ``per_client`` ``marker`` (DATA_SYNC; another
    front end's) or ``seconds`` passed,
    counting the bytes, decoding nothing: the clients synced, closed, the bytes read and
    when the last one was synced (``time.monotonic``)."""
    selector = selectors.DefaultSelector()
    for sock in socks:
        sock.setblocking(False)
        selector.register(sock, selectors.EVENT_READ, [b"", 0])
    synced = closed = received = 0
    last = 0.0
    deadline = time.monotonic() + seconds
    while synced + closed < len(socks) and time.monotonic() < deadline:
        for key, _ in selector.select(0.2):
            try:
                data = key.fileobj.recv(1 << 20)  # type: ignore[union-attr]
            except BlockingIOError:
                continue
            except OSError:
                data = b""
            if not data:
                selector.unregister(key.fileobj)
                closed += 1
                continue
            received += len(data)
            tail, seen = key.data
            both = tail + data
            seen += both.count(marker) - tail.count(marker)
            key.data[:] = [both[-16:], seen]
            if seen >= per_client:
                selector.unregister(key.fileobj)
                synced += 1
                last = time.monotonic()
    return synced, closed, received, last


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--clients", type=int, default=1000)
    parser.add_argument("--back", type=int, default=100, help="messages missed per subject")
    args = parser.parse_args()
    server = Server(MaxConnectionRatePerAddress="0", MaxConnectionsPerAddress="0",
                    MaxPublishesPerSecond="0")
    try:
        epoch = fill(server)
        clients = []
        for i in range(args.clients):
            client = RawClient(server.port, timeout=60)
            client.connect(f"c{i}")
            clients.append(client)
        resume = ws.encode_masked_binary(ops.encode_client_op(ops.Subscribe(tuple(
            ops.SubscriptionRequest(s, position=Position(epoch, CACHED - args.back))
            for s in SUBJECTS))), b"abcd")
        rss_before, cpu_before = server.rss(), cpu_seconds(server.proc.pid)
        bystander = Bystander(server.port)
        started = time.monotonic()
        for client in clients:
            client.sock.sendall(resume)
        synced, closed, received, _ = read_until_synced([c.sock for c in clients], 120.0)
        elapsed = time.monotonic() - started
        delays = bystander.stop()
        gaps = server.stats()["loop_gaps"]
        print(json.dumps({
            "clients": args.clients, "back": args.back, "synced": synced, "closed": closed,
            "seconds": round(elapsed, 1), "bytes_read": received,
            "server_cpu_s": round(cpu_seconds(server.proc.pid) - cpu_before, 2),
            "rss_before_kib": rss_before, "rss_after_kib": server.rss(),
            "loop_gap_max_ms": gaps["max_ms"], "longest_gap_parts_ms": gaps.get(
                "longest_gap_parts_ms"),
            "bystander_max_ms": delays["max_ms"],
        }))
    finally:
        server.stop()


if __name__ == "__main__":
    main()
