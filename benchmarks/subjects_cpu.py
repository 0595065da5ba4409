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
receive every message (checked). ``--breakdown`` runs the server under
``benchmarks/serve_breakdown.py`` and splits its CPU per message into parts.

    .venv/bin/python benchmarks/subjects_cpu.py            # 10,000 subjects, bursts of 1 and 16
    .venv/bin/python benchmarks/subjects_cpu.py --burst 1 --messages 20000 --set BatchTime=0
    .venv/bin/python benchmarks/subjects_cpu.py --breakdown      # where the CPU goes
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import select
import signal
import socket
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import cbor2

from migratory.bench.loadgen import UNLIMITED, receive, split, stop_processes
from migratory.bench.procfs import cpu_seconds, raise_nofile
from migratory.bench.publish_wire import native_wire
from migratory.bench.server_process import ServerProcess
from migratory.bench.subscriber import subscriber_main
from migratory.bench.wsraw import RECV_SIZE, masked, open_connections


def publish_bursts(
    sock: socket.socket, pending: bytes, subjects: int, start: int, count: int, burst: int,
    size: int, timeout: float,
) -> int:
    """``count`` acknowledged publishes from message ``start`` on, ``burst`` per send, each
    burst's acknowledgements awaited; the number acknowledged."""
    encode, replies = native_wire(subjects, True, size)
    ep = select.epoll()
    ep.register(sock.fileno(), select.EPOLLIN)
    deadline = time.monotonic() + timeout
    acked = 0
    i = start
    try:
        while i < start + count and time.monotonic() < deadline:
            n = min(burst, start + count - i)
            out = bytearray()
            for k in range(n):
                encode(out, i + k, time.monotonic_ns())
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


class BreakdownServer(ServerProcess):
    """The server under ``benchmarks/serve_breakdown.py``; it writes its JSON to ``out``."""

    def __init__(self, settings: list[str]) -> None:
        super().__init__("subjects-cpu", settings)
        self.out = self.log_path.with_suffix(".breakdown.json")
        os.environ["BREAKDOWN_OUT"] = str(self.out)  # inherited by the server process

    def command(self) -> list[str]:
        python, _m, _cluster, *rest = super().command()
        return [python, str(Path(__file__).resolve().parent / "serve_breakdown.py"), *rest]


def read_breakdown(server: BreakdownServer, messages: int) -> str:
    """What the server's trio thread spent per message, by part (see serve_breakdown)."""
    server.out.unlink(missing_ok=True)
    os.kill(server.pid, signal.SIGUSR2)
    deadline = time.monotonic() + 10
    while not server.out.exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    time.sleep(0.1)
    f = json.loads(server.out.read_text())
    n = max(messages, 1)
    writes = f.get("write", 0.0)
    outside = writes - f.get("write_in_after_processing", 0.0)
    after = f.get("after_processing", 0.0) - f.get("write_in_after_processing", 0.0)
    rest = (f["total"] - f["io_wait"] - f.get("receive_data", 0.0) - after - writes
            - f.get("gc", 0.0))
    part = {
        "input processed": f.get("receive_data", 0.0), "sends": writes, "after input": after,
        "epoll waits": f["io_wait"], "gc": f.get("gc", 0.0), "rest": rest,
    }
    shown = ", ".join(f"{name} {1e6 * v / n:.1f}" for name, v in part.items())
    return (f"{shown}; total {1e6 * f['total'] / n:.1f} ({f['passes'] / n:.2f} loop passes, "
            f"{f.get('write_calls', 0) / n:.2f} sends per message, of them "
            f"{1e6 * outside / n:.1f} us outside input)")


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
    parser.add_argument("--breakdown", action="store_true",
                        help="run the server under benchmarks/serve_breakdown.py and show "
                             "where its CPU goes per message")
    args = parser.parse_args(argv)
    bursts = args.burst or [1, 16]
    raise_nofile()
    settings = [*UNLIMITED, "LogLevel=WARNING", *args.set]
    server = (
        BreakdownServer(settings) if args.breakdown else ServerProcess("subjects-cpu", settings)
    )
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
        breakdowns: dict[int, str] = {}
        for burst in bursts:
            if args.breakdown:
                os.kill(server.pid, signal.SIGUSR1)
            c0, t0 = cpu_seconds(server.pid), time.monotonic()
            acked = publish_bursts(conn.sock, conn.buf, args.subscribers, sent, args.messages,
                                   burst, args.size, 300.0)
            c1, t1 = cpu_seconds(server.pid), time.monotonic()
            if args.breakdown:
                breakdowns[burst] = read_breakdown(server, acked)
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
        for burst, line in breakdowns.items():
            print(f"burst {burst:>3}, us of the trio thread's CPU per message: {line}")
        print(f"every message delivered: {delivered} ({received} of {sent})")
        return 0 if delivered else 1
    finally:
        stop_processes(procs)  # type: ignore[arg-type]
        server.stop()


if __name__ == "__main__":
    sys.exit(main())
