#!/usr/bin/env python3
"""CPU per publish through one server's publish path, in process (no sockets).

Feeds pre-encoded, masked publish frames (100-byte content, round-robin over
``--subjects`` subjects, with or without a closure) into a real ``Session`` built on a
real ``Server`` context and hub, the way ``Connection`` does after a ``recv``: so it
measures WebSocket decoding, CBOR decoding, checks, the hub (numbering, cache, snapshot,
fan-out to ``--subscribers-per-subject`` in-process sinks that only count) and the
acknowledgement's encoding, but no socket I/O and no trio scheduling.

CPU time (``time.process_time``) is what it reports, so the figure holds on a busy
machine; it is the upper bound of publishes/s one core could accept through this path
(the issue-13 target is >= 100,000/s for one process, socket I/O included). ``--profile``
prints the top functions (cProfile) -- profile before optimising.

    .venv/bin/python benchmarks/publish_path_cpu.py [--count 200000] [--subjects 10000]
        [--chunk 64] [--no-ack] [--subscribers-per-subject 1] [--profile]
"""

from __future__ import annotations

import argparse
import cProfile
import os
import pstats
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import cbor2

from migratory.config import load_config
from migratory.protocol import ops
from migratory.protocol import websocket as ws
from migratory.server.app import Server
from migratory.server.session import Session


class NullLink:
    """The transport a session writes to: counts, never writes."""

    writing = False

    def __init__(self) -> None:
        self.dirty = 0

    def mark_dirty(self) -> None:
        self.dirty += 1

    def flush_now(self) -> None:
        pass


class CountingSink:
    """A subscriber that counts the frames it is given (what fan-out costs to reach it)."""

    def __init__(self) -> None:
        self.frames = 0

    def deliver(self, frame: bytes) -> None:
        self.frames += 1


def frames(
    count: int, subjects: int, ack: bool, chunk: int, mask: bytes | None = None
) -> list[bytes]:
    """The publish frames (closure = the publish's number when ``ack``), joined ``chunk``
    at a time (one ``recv`` each), masked with ``mask`` (a random one by default)."""
    mask = os.urandom(4) if mask is None else mask
    out: list[bytes] = []
    batch = bytearray()
    for i in range(count):
        op: dict[str, object] = {
            "op": "publish", "subject": f"/bench/s/{i % subjects}", "content": b"x" * 100,
        }
        if ack:
            op["closure"] = str(i)
        batch += ws.encode_masked_binary(cbor2.dumps(op), mask)
        if (i + 1) % chunk == 0:
            out.append(bytes(batch))
            batch.clear()
    if batch:
        out.append(bytes(batch))
    return out


def run(args: argparse.Namespace) -> dict:
    server = Server(load_config(overrides={"Listen": "127.0.0.1:0"}, environ={}))
    ctx = server.ctx
    link = NullLink()
    session = Session(ctx, link, "bench")
    session.receive_data(
        b"GET / HTTP/1.1\r\nHost: x\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
        b"Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n\r\n",
        0.0,
    )
    mask = os.urandom(4)
    connect = {"op": "connect", "version": ops.PROTOCOL_VERSION, "client": "bench"}
    session.receive_data(ws.encode_masked_binary(cbor2.dumps(connect), mask), 0.0)
    sinks = []
    for s in range(args.subjects if args.subscribers_per_subject else 0):
        for _ in range(args.subscribers_per_subject):
            sink = CountingSink()
            sinks.append(sink)
            request = ops.SubscriptionRequest(f"/bench/s/{s}")
            list(ctx.hub.subscribe(sink, request, 0.0))  # type: ignore[arg-type]
    chunks = frames(args.count, args.subjects, args.ack, args.chunk)
    session.outbox.take()
    profiler = cProfile.Profile() if args.profile else None
    started_cpu = time.process_time()
    started = time.perf_counter()
    if profiler is not None:
        profiler.enable()
    for n, data in enumerate(chunks):
        session.receive_data(data, float(n))
        if n % 16 == 0:
            session.outbox.take()  # what the socket write would take away
    if profiler is not None:
        profiler.disable()
    cpu = time.process_time() - started_cpu
    wall = time.perf_counter() - started
    assert not session.closing, f"the session closed: {session.close_code}"
    received = ctx.stats.publishes_received
    assert received == args.count, (received, args.count)
    delivered = sum(s.frames for s in sinks)
    if profiler is not None:
        pstats.Stats(profiler).sort_stats("tottime").print_stats(25)
    return {
        "publishes": received,
        "cpu_seconds": cpu,
        "wall_seconds": wall,
        "cpu_us_per_publish": cpu / received * 1e6,
        "publishes_per_cpu_second": received / cpu,
        "deliveries": delivered,
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--count", type=int, default=200_000)
    parser.add_argument("--subjects", type=int, default=10_000)
    parser.add_argument("--chunk", type=int, default=64, help="publish frames per recv")
    parser.add_argument("--no-ack", dest="ack", action="store_false")
    parser.add_argument("--subscribers-per-subject", type=int, default=1)
    parser.add_argument("--profile", action="store_true")
    args = parser.parse_args()
    result = run(args)
    print(
        f"{result['publishes']:,} publishes ({args.subjects:,} subjects, "
        f"{args.subscribers_per_subject} subscriber(s) each, "
        f"{'with' if args.ack else 'without'} acks, {args.chunk} per recv): "
        f"{result['cpu_us_per_publish']:.2f} µs CPU per publish = "
        f"{result['publishes_per_cpu_second']:,.0f} publishes per CPU second; "
        f"{result['deliveries']:,} deliveries"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
