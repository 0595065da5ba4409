"""A herd of resumes from different positions (issue 13, "no stalls"): many clients,
each resuming several subjects, each subject from its own position -- the subscribers
of many subjects moving to another member when theirs died, each caught up to wherever
it was. Nothing is shared between two resumes (``benchmarks/resume_herd.py`` is the herd
from one position, whose recovered batches are built once).

One server process on 127.0.0.1 caches ``--cached`` messages of 100 bytes on each of
``--subjects`` subjects. ``--procs`` client processes connect ``--clients`` connections
between them (raw sockets), then, at one signal, each connection sends one ``subscribe``
resuming ``--per-client`` subjects, each from a position drawn between 1 and ``--back``
messages back (seeded): every client is then counted (the bytes
``DATA_SYNC``, nothing decoded) until it has all its DATA_SYNC. Reported: the time until
every client had them, the server's CPU meanwhile, its longest event-loop gap in that
window and what the longest gap since start was made of (``/stats loop_gaps``), the
bytes read, and a bystander's largest delay (a client publishing to itself every 20 ms
meanwhile, each message waited for 10 s at most, else lost)::

    .venv/bin/python benchmarks/resume_herd_spread.py --clients 5000 --per-client 10 --back 100

docs/benchmarks.md, "A herd of resumes from different positions".
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import random
import socket
import sys
import time
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).parents[1] / "tests" / "server"))
sys.path.insert(0, str(Path(__file__).parent))

from attacks import Server
from bystander import Bystander
from rawclient import RawClient
from resume_herd import cpu_seconds, read_until_synced

from migratory.model.message import Message
from migratory.model.position import Position
from migratory.protocol import ops
from migratory.protocol import websocket as ws


def fill(server: Server, subjects: list[str], cached: int) -> int:
    """Cache ``cached`` messages on each subject; their epoch (one server: one epoch)."""
    publisher = RawClient(server.port, timeout=120)
    publisher.connect("publisher")
    for n in range(cached):
        for subject in subjects:
            publisher.send_op(ops.Publish(Message(subject, b"x" * 100)))
        if n % 50 == 49:  # keep the server's answers (none: no closure) and reads in step
            publisher.send_op(ops.Ping(n))
            while not isinstance(publisher.recv_op(), ops.Pong):
                pass
    publisher.send_op(ops.Ping(0))
    while not isinstance(publisher.recv_op(), ops.Pong):
        pass
    publisher.send_op(ops.Subscribe((ops.SubscriptionRequest(subjects[0]),)))
    allow = publisher.recv_op()
    assert isinstance(allow, ops.SubjectStatus) and allow.position is not None
    assert allow.position.seq == cached, allow.position
    publisher.close()
    return allow.position.epoch


def resume_frame(rng: random.Random, subjects: list[str], per_client: int, epoch: int,
                 cached: int, back: int) -> bytes:
    """One client's subscribe: ``per_client`` subjects, each from its own position."""
    requests = tuple(
        ops.SubscriptionRequest(subject, position=Position(epoch, cached - rng.randint(1, back)))
        for subject in rng.sample(subjects, per_client))
    return ws.encode_masked_binary(ops.encode_client_op(ops.Subscribe(requests)), b"abcd")


def swarm(port: int, frames: list[bytes], per_client: int, pipe: Connection) -> None:
    """One client process: connect every client, say so, wait for the signal, send every
    resume, count each client's DATA_SYNC; send back when the last one had all of them."""
    clients = []
    for i, _ in enumerate(frames):
        client = RawClient(port, timeout=120)
        client.connect(f"h{os.getpid()}-{i}")
        clients.append(client.sock)
    pipe.send("connected")
    pipe.recv()  # go
    for sock, frame in zip(clients, frames, strict=True):
        sock.sendall(frame)
    synced, closed, received, last = read_until_synced(clients, 300.0, per_client)
    pipe.send({"synced": synced, "closed": closed,
               "bytes": received, "last": last})
    for sock in clients:
        sock.close()


def herd_arguments(parser: argparse.ArgumentParser) -> None:
    """The arguments every herd takes (benchmarks/resume_herd_fronts.py too)."""
    parser.add_argument("--clients", type=int, default=5000)
    parser.add_argument("--per-client", type=int, default=10, help="subjects resumed each")
    parser.add_argument("--subjects", type=int, default=100)
    parser.add_argument("--cached", type=int, default=1000, help="messages per subject")
    parser.add_argument("--back", type=int, default=100,
                        help="messages missed per subject at most (< --cached)")
    parser.add_argument("--procs", type=int, default=4, help="client processes")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE")


def run_herd(server: Server, target: Any, per_proc: list[tuple[Any, ...]]) -> dict[str, Any]:
    """One client process per entry of ``per_proc`` (``target``'s arguments, its end of
    a pipe last); once all connected, a bystander, the signal, then the figures."""
    context = multiprocessing.get_context("fork")
    pipes, procs = [], []
    for proc_args in per_proc:
        ours, theirs = context.Pipe()
        proc = context.Process(target=target, args=(*proc_args, theirs))
        proc.start()
        pipes.append(ours)
        procs.append(proc)
    for pipe in pipes:
        assert pipe.recv() == "connected"
    time.sleep(1.0)  # the connections' own work over
    bystander = Bystander(server.port, seconds=900)  # (before: herds of minutes)
    cpu_before = cpu_seconds(server.proc.pid)
    started = time.monotonic()
    for pipe in pipes:
        pipe.send("go")
    results = [pipe.recv() for pipe in pipes]
    ended = max(r["last"] for r in results)
    cpu = cpu_seconds(server.proc.pid) - cpu_before
    delays = bystander.stop()
    time.sleep(1.1)  # the gaps of the last second reach /stats
    stats = server.stats()
    gaps = stats["loop_gaps"]
    inside = [gap for second, gap in gaps["per_second"]
              if int(started) <= second <= int(ended) + 1]
    for proc in procs:
        proc.join(30)
    return {
        "synced": sum(r["synced"] for r in results),
        "closed": sum(r["closed"] for r in results),
        "all_synced_s": round(ended - started, 2),
        "server_cpu_s": round(cpu, 2),
        "loop_gap_max_ms": max(inside, default=None),
        "longest_gap_parts_ms": gaps.get("longest_gap_parts_ms"),
        "bytes_read": sum(r["bytes"] for r in results),
        "bystander_max_ms": delays["max_ms"], "bystander_lost": delays["lost"],
        "loop_turns": stats.get("loop_turns"), "slow_consumers": stats.get("slow_consumers"),
        "load": os.getloadavg()[0],
    }


def report(args: argparse.Namespace, figures: dict[str, Any], **first: Any) -> None:
    """One line of JSON: the herd's shape, then its figures."""
    print(json.dumps({**first, "clients": args.clients, "per_client": args.per_client,
                      "subjects": args.subjects, "cached": args.cached, "back": args.back,
                      **figures}))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    herd_arguments(parser)
    args = parser.parse_args()
    settings = dict(s.split("=", 1) for s in args.set)
    server = Server(MaxConnectionRatePerAddress="0", MaxConnectionsPerAddress="0",
                    MaxPublishesPerSecond="0", MaxHandshakesPerAddress="0",
                    MaxCachedMessagesPerSubject=str(args.cached), **settings)
    try:
        subjects = [f"/Spread/s{i}" for i in range(args.subjects)]
        epoch = fill(server, subjects, args.cached)
        rng = random.Random(args.seed)
        frames = [resume_frame(rng, subjects, args.per_client, epoch, args.cached, args.back)
                  for _ in range(args.clients)]
        figures = run_herd(server, swarm, [
            (server.port, frames[p::args.procs], args.per_client) for p in range(args.procs)])
        report(args, figures)
    finally:
        server.stop()


if __name__ == "__main__":
    socket.setdefaulttimeout(None)
    main()
