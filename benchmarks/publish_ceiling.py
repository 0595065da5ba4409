#!/usr/bin/env python3
"""Publishes per second one server process accepts: the issue-13 ceiling (>= 100,000/s).

Starts ``python -m cluster serve`` on 127.0.0.1 (or measures ``--url``), then
``--procs`` load processes open ``--connections`` raw native sessions between them and
publish 100-byte messages round-robin over ``--subjects`` subjects, as fast as the
server takes them: pre-encoded, masked frames written in blocks of 256 with
non-blocking sends (TCP back-pressure is the only pacing). With ``--ack`` every
publish carries a closure and each connection keeps at most ``--window`` unanswered;
acknowledgements are counted as frames, not decoded. No subscribers: this is the
publish path alone (numbering, cache, snapshot, acknowledgement).

The figure is the server's own count: ``messages_published`` from ``GET /stats``
before and after the measured window (after one second of warm-up), divided by the
window. CPU of the server and of the load processes is reported, so a load
generator that ran out of CPU shows.

    .venv/bin/python benchmarks/publish_ceiling.py --connections 1
    .venv/bin/python benchmarks/publish_ceiling.py --connections 100 --procs 2
    .venv/bin/python benchmarks/publish_ceiling.py --connections 1 --ack --window 2000

Exit status 0 = ran (the figure is printed against the target), 2 = could not run.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import select
import socket
import sys
import time
from multiprocessing.connection import Connection
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from migratory.bench.procfs import CpuMeter, die_with_parent, machine_description
from migratory.bench.server_process import ServerProcess, server_stats
from migratory.bench.wsraw import open_raw, publish_frame, walk_frames

BLOCK = 256
TARGET = 100_000


def load(port: int, conns: int, first: int, subjects: int, size: int, ack: bool,
         window: int, pipe: Connection) -> None:
    """One load process: open ``conns`` sessions, report ready, publish until told to stop."""
    die_with_parent()
    socks = []
    for i in range(conns):
        sock, _ = open_raw(port, f"ceiling-{first + i}")
        sock.setblocking(False)
        socks.append(sock)
    content = b"x" * size
    blocks = []
    for i in range(conns):
        closure = "c" if ack else None
        frames = [publish_frame(f"/ceiling/s{(first + i + k) % subjects}", content, closure)
                  for k in range(BLOCK)]
        blocks.append(b"".join(frames))
    pipe.send("ready")
    pipe.recv()  # go
    ep = select.epoll()
    fd_index = {s.fileno(): i for i, s in enumerate(socks)}
    pending = [memoryview(b"") for _ in socks]
    in_flight = [0] * conns
    acked = 0
    partial = [b""] * conns
    for s in socks:
        ep.register(s.fileno(), select.EPOLLOUT | (select.EPOLLIN if ack else 0))
    stop = False
    while not stop:
        if pipe.poll():
            stop = True
            break
        for fd, event in ep.poll(0.05):
            i = fd_index[fd]
            sock = socks[i]
            if event & select.EPOLLIN:
                try:
                    data = sock.recv(1 << 20)
                except BlockingIOError:
                    data = None
                if data == b"":
                    raise SystemExit(f"connection {i} closed by the server")
                if data:
                    buf = partial[i] + data
                    frames, used = walk_frames(buf)
                    partial[i] = buf[used:]
                    in_flight[i] -= len(frames)
                    acked += len(frames)
            if event & select.EPOLLOUT:
                if not pending[i] and (not ack or in_flight[i] + BLOCK <= window):
                    pending[i] = memoryview(blocks[i])
                    in_flight[i] += BLOCK
                if pending[i]:
                    try:
                        sent = sock.send(pending[i])
                    except BlockingIOError:
                        sent = 0
                    pending[i] = pending[i][sent:]
    pipe.send(acked)
    for s in socks:
        s.close()


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--url", help="a running server ws://127.0.0.1:PORT (default: start one)")
    p.add_argument("--connections", type=int, default=1)
    p.add_argument("--procs", type=int, default=0, help="load processes (default: min(2, conns))")
    p.add_argument("--subjects", type=int, default=100)
    p.add_argument("--size", type=int, default=100)
    p.add_argument("--duration", type=float, default=10.0)
    p.add_argument("--ack", action="store_true")
    p.add_argument("--window", type=int, default=2048, help="unanswered publishes per conn")
    p.add_argument("--set", action="append", default=[], metavar="Key=Value")
    p.add_argument("--json")
    args = p.parse_args()
    procs = args.procs or min(2, args.connections)
    server = None
    if args.url:
        host_port = args.url.split("://", 1)[-1].rstrip("/")
        host, port = host_port.rsplit(":", 1)[0], int(host_port.rsplit(":", 1)[1])
        server_pid = None
    else:
        settings = ["MaxPublishesPerSecond=0", "MaxConnectionsPerAddress=0",
                    "MaxHandshakesPerAddress=0", "MaxConnectionRatePerAddress=0",
                    "MaxTlsHandshakeRate=0", *args.set]
        server = ServerProcess("publish-ceiling", settings)
        try:
            server.start()
        except RuntimeError as exc:
            print(exc, file=sys.stderr)
            return 2
        host, port, server_pid = server.host, server.port, server.pid
    pipes, children = [], []
    try:
        share = [args.connections // procs + (1 if i < args.connections % procs else 0)
                 for i in range(procs)]
        first = 0
        for n in share:
            parent, child = mp.Pipe()
            proc = mp.Process(target=load, args=(port, n, first, args.subjects, args.size,
                                                  args.ack, args.window, child), daemon=True)
            proc.start()
            pipes.append(parent)
            children.append(proc)
            first += n
        for pipe in pipes:
            if not pipe.poll(60):
                print("a load process did not get ready in 60 s", file=sys.stderr)
                return 2
            pipe.recv()
        meter = CpuMeter({"server": server_pid} if server_pid else {})
        for i, proc in enumerate(children):
            assert proc.pid is not None
            meter.add(f"load-{i}", proc.pid)
        for pipe in pipes:
            pipe.send("go")
        time.sleep(1.0)  # warm-up
        before = server_stats(host, port)
        meter.start()
        t0 = time.monotonic()
        time.sleep(args.duration)
        after = server_stats(host, port)
        elapsed = time.monotonic() - t0
        cpu = meter.stop()
        for pipe in pipes:
            pipe.send("stop")
        acked = sum(pipe.recv() for pipe in pipes if pipe.poll(30))
        if before is None or after is None:
            print("the server did not answer GET /stats", file=sys.stderr)
            return 2
        published = after["messages_published"] - before["messages_published"]
        rate = published / elapsed
        result = {
            "connections": args.connections, "procs": procs, "ack": args.ack,
            "window": args.window if args.ack else None, "subjects": args.subjects,
            "size": args.size, "duration_s": round(elapsed, 2), "published": published,
            "publishes_per_s": round(rate), "acknowledgements_counted": acked,
            "cpu_percent": {k: round(v) for k, v in cpu.items()},
            "machine": machine_description(), "target_per_s": TARGET,
            "met": rate >= TARGET,
        }
        print(f"{args.connections} connection(s) in {procs} process(es), "
              f"{'acknowledged' if args.ack else 'unacknowledged'} publishes, "
              f"{args.subjects} subjects, {args.size} B: {rate:,.0f} publishes/s accepted "
              f"(server count over {elapsed:.1f} s); CPU "
              + ", ".join(f"{k} {v:.0f} %" for k, v in cpu.items() if k != "wall_seconds")
              + f"; target >= {TARGET:,}/s: {'met' if rate >= TARGET else 'NOT met'}")
        if args.json:
            Path(args.json).write_text(json.dumps(result, indent=2))
        return 0
    finally:
        for proc in children:
            proc.join(5)
            if proc.is_alive():
                proc.kill()
        if server is not None:
            server.stop()


if __name__ == "__main__":
    socket.setdefaulttimeout(30)
    os.environ.setdefault("PYTHONHASHSEED", "0")
    sys.exit(main())
