#!/usr/bin/env python3
"""Server CPU per message in the many-subjects shape, whatever else the machine runs.

A real server process (``python -m cluster serve``) with ``--subscribers`` raw WebSocket
subscribers, each on its own subject (the bench's subscriber processes), and a publisher
in this process that goes round-robin over the subjects in **bursts**: it writes
``--burst`` acknowledged publishes in one ``send``, then waits for their ``PUBLISH_OK``
before the next burst. With ``--burst 1`` every publish is a scheduler pass of its own,
as at 10,000 msg/s on a quiet machine (every wake-up, ``recv``, ``send`` and ``epoll``
call is paid per message); larger bursts are what a loaded server sees. The figure is the
server's CPU time (utime + stime from /proc) over the publishing, divided by the messages:
it holds on a busy machine, unlike a latency or a rate. ``--idle`` seconds first measure
what the server costs per second with the subscribers connected and nothing published
(its fixed costs: expiry sweep, ticks, probes), reported apart. Every subscriber must
receive every message (checked).

    .venv/bin/python benchmarks/subjects_cpu.py            # 10,000 subjects, bursts of 1 and 16
    .venv/bin/python benchmarks/subjects_cpu.py --burst 1 --messages 20000 --set BatchTime=0
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import select
import socket
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import cbor2

from migratory.bench.loadgen import UNLIMITED, receive, split, stop_processes
from migratory.bench.procfs import cpu_seconds, raise_nofile
from migratory.bench.publisher import native_wire
from migratory.bench.server_process import ServerProcess
from migratory.bench.stamp import MARK, STAMP_END
from migratory.bench.subscriber import subscriber_main
from migratory.bench.wsraw import RECV_SIZE, masked, open_connections


def publish_bursts(
    sock: socket.socket, pending: bytes, subjects: int, start: int, count: int, burst: int,
    size: int, timeout: float,
) -> int:
    """``count`` acknowledged publishes from message ``start`` on, ``burst`` per send, each
    burst's acknowledgements awaited; the number acknowledged."""
    encode, replies = native_wire(subjects, True)
    padding = b"x" * (size - STAMP_END)
    ep = select.epoll()
    ep.register(sock.fileno(), select.EPOLLIN)
    deadline = time.monotonic() + timeout
    acked = 0
    i = start
    try:
        while i < start + count and time.monotonic() < deadline:
            n = min(burst, start + count - i)
            out = b"".join(
                encode(MARK + b"%019d" % time.monotonic_ns() + padding, i + k)[0]
                for k in range(n)
            )
            sock.setblocking(True)
            sock.sendall(out)
            sock.setblocking(False)
            i += n
            waiting = n
            while waiting and time.monotonic() < deadline:
                if not ep.poll(1.0):
                    continue
                data = sock.recv(RECV_SIZE)
                if not data:
                    raise RuntimeError("the server closed the publisher")
                found, pending = replies(pending + data)
                for status, _key in found:
                    if status != "PUBLISH_OK":
                        raise RuntimeError(f"publish answered {status}")
                    waiting -= 1
                    acked += 1
    finally:
        ep.close()
    return acked


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--subscribers", type=int, default=10000)
    parser.add_argument("--procs", type=int, default=2)
    parser.add_argument("--burst", type=int, action="append",
                        help="publishes per send, acknowledged before the next (repeatable; "
                             "default 1 and 16)")
    parser.add_argument("--messages", type=int, default=20000, help="per burst size")
    parser.add_argument("--size", type=int, default=100)
    parser.add_argument("--idle", type=float, default=3.0, help="seconds of idle measure")
    parser.add_argument("--set", action="append", default=[], metavar="Key=Value")
    args = parser.parse_args(argv)
    bursts = args.burst or [1, 16]
    raise_nofile()
    server = ServerProcess("subjects-cpu", [*UNLIMITED, "LogLevel=WARNING", *args.set])
    procs: list[mp.Process] = []
    server.start()
    try:
        ctx = mp.get_context("fork")
        pipes = []
        for first, count in split(args.subscribers, args.procs):
            parent_end, child_end = ctx.Pipe()
            proc = ctx.Process(
                target=subscriber_main,
                args=(child_end, server.host, server.port, first, count, 120.0, 900.0,
                      args.subscribers),
                daemon=True,
            )
            proc.start()
            child_end.close()
            procs.append(proc)
            pipes.append(parent_end)
        hello = masked(cbor2.dumps({"op": "connect", "version": 1, "client": "cpu-publisher"}))
        setup = open_connections(server.host, server.port, range(1), lambda _i: hello,
                                 ready_marker=b"connected", timeout=30.0)
        if not setup.ready:
            raise RuntimeError(f"publisher could not connect: {dict(setup.failures)}")
        conn = setup.ready[0]
        ready = receive(pipes, "ready", 180)
        subscribed = sum(r[1] for r in ready)
        if subscribed != args.subscribers:
            raise RuntimeError(f"{subscribed} of {args.subscribers} subscribed: {ready}")
        time.sleep(2.0)  # the set-up's garbage collections and writes settle
        c0 = cpu_seconds(server.pid)
        time.sleep(args.idle)
        idle_ms = (cpu_seconds(server.pid) - c0) / args.idle * 1000
        print(f"server idle with {args.subscribers} subscribers: {idle_ms:.1f} ms CPU per s",
              flush=True)
        sent = 0
        rows = []
        for burst in bursts:
            c0, t0 = cpu_seconds(server.pid), time.monotonic()
            acked = publish_bursts(conn.sock, conn.buf, args.subscribers, sent, args.messages,
                                   burst, args.size, 300.0)
            c1, t1 = cpu_seconds(server.pid), time.monotonic()
            conn.buf = b""
            sent += acked
            rate = acked / (t1 - t0)
            per = (c1 - c0) / max(acked, 1) * 1e6
            fixed = idle_ms / 1000 / max(rate, 1e-9) * 1e6
            rows.append((burst, acked, rate, per, per - fixed))
            time.sleep(0.5)
        for pipe in pipes:
            pipe.send(("finish", sent, 10.0))
        results = [r[1] for r in receive(pipes, "result", 60)]
        received = sum(r["received"] for r in results)
        delivered = received == sent
        print(f"{'burst':>5} {'messages':>9} {'msg/s':>8} {'us CPU/msg':>11} {'less idle':>10}")
        for burst, acked, rate, per, net in rows:
            print(f"{burst:>5} {acked:>9} {rate:>8.0f} {per:>11.1f} {net:>10.1f}")
        print(f"every message delivered: {delivered} ({received} of {sent})")
        return 0 if delivered else 1
    finally:
        stop_processes(procs)  # type: ignore[arg-type]
        server.stop()


if __name__ == "__main__":
    sys.exit(main())
