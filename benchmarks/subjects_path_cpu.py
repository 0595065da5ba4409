#!/usr/bin/env python3
"""Python CPU per message of the many-subjects shape, in process, the sends faked.

A real ``Server`` (context, hub, drain) with ``--subscribers`` real ``Connection`` objects,
each subscribed to its own subject through its own ``Session``, whose socket ``send``
takes every byte and does nothing; and one publisher ``Connection`` fed pre-encoded,
masked, acknowledged publish frames (100-byte content, round-robin over the subjects),
``--chunk`` of them per "recv". Around each chunk it does what ``Connection._read_once``
does: the session processes it (at most 64 operations a turn), then
``_after_processing`` writes the publisher's acknowledgements and, through
``Server.write_urgent``, one write to each idle subscriber delivered to. The batch tick
runs every 10 ms of simulated time at ``--rate``, and publishes are timed with a clock
like trio's, as the server does.

So it counts the server's Python work per message -- WebSocket and CBOR decoding, the
checks, the hub, the delivery frame, the acknowledgement, the outboxes, the dirty/urgent
sets and the write's bookkeeping -- and leaves out what the profile on a real server adds
(the kernel's ``send``/``recv``, ``epoll``, trio's scheduling). CPU time
(``time.process_time``), so it holds on a busy machine; for an A/B, run it alternately
from two checkouts (the script imports the checkout it sits in)::

    .venv/bin/python benchmarks/subjects_path_cpu.py [--count 100000] [--rounds 3]
        [--subscribers 10000] [--chunk 16] [--profile]
"""

from __future__ import annotations

import argparse
import cProfile
import gc
import os
import pstats
import statistics
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import cbor2
from publish_path_cpu import frames

from migratory.config import load_config
from migratory.listeners import OPEN_LISTENER
from migratory.protocol import ops
from migratory.protocol import websocket as ws
from migratory.server.app import Server
from migratory.server.connection import Connection

HANDSHAKE = (
    b"GET / HTTP/1.1\r\nHost: x\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
    b"Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n\r\n"
)


class NullSocket:
    """A socket whose ``send`` takes everything and does nothing (counted)."""

    __slots__ = ("sent", "writes")

    def __init__(self) -> None:
        self.sent = 0
        self.writes = 0

    def fileno(self) -> int:
        return -1

    def send(self, data: bytes) -> int:
        self.writes += 1
        self.sent += len(data)
        return len(data)


class Clock:
    """trio's ``SystemClock.current_time``: a method adding an offset to perf_counter."""

    offset = 0.0

    def current_time(self) -> float:
        return self.offset + time.perf_counter()


def connect(server: Server, mask: bytes, name: str) -> Connection:
    """A connection through the WebSocket handshake and ``connect``."""
    connection = Connection(server, NullSocket(), "127.0.0.1:1", OPEN_LISTENER)  # type: ignore[arg-type]
    server.connections.add(connection)
    session = connection.session
    session.receive_data(HANDSHAKE, 0.0)
    hello = {"op": "connect", "version": ops.PROTOCOL_VERSION, "client": name}
    session.receive_data(ws.encode_masked_binary(cbor2.dumps(hello), mask), 0.0)
    connection._after_processing()
    return connection


def publish_chunks(count: int, subjects: int, chunk: int, mask: bytes) -> list[bytes]:
    """Acknowledged publishes (closure = the publish's number), ``chunk`` per bytes."""
    return frames(count, subjects, True, chunk, mask)


def build(subscribers: int) -> tuple[Server, Connection, list[Connection], bytes]:
    server = Server(load_config(overrides={"Listen": "127.0.0.1:0"}, environ={}))
    server.admission.handshake_done = lambda connection: None  # type: ignore[method-assign]
    mask = os.urandom(4)
    subscribed = []
    for s in range(subscribers):
        connection = connect(server, mask, f"sub{s}")
        request = {"op": "subscribe", "subjects": [{"subject": f"/bench/s/{s}"}]}
        connection.session.receive_data(ws.encode_masked_binary(cbor2.dumps(request), mask), 0.0)
        connection._after_processing()
        subscribed.append(connection)
    publisher = connect(server, mask, "pub")
    # LocalPublishing times each publish with trio's clock, which it finds only inside
    # trio.run: give it one of the same shape
    server.ctx.publishing._inner._clock = Clock().current_time  # type: ignore[attr-defined]
    server.batch_tick()
    server.batch_tick()
    return server, publisher, subscribed, mask


def publish(server: Server, publisher: Connection, chunks: list[bytes], rate: float,
            profiler: cProfile.Profile | None) -> float:
    """Feed ``chunks`` as the reader task would; the CPU seconds it took."""
    session = publisher.session
    chunk = ops_per_chunk(chunks[0])
    per_tick = max(1, int(rate * 0.010 / chunk))  # chunks per 10 ms batch tick
    now = server.ctx.stats.publishes_received / rate + 1000.0  # on from the last round
    step = chunk / rate
    gc.collect()
    started = time.process_time()
    if profiler is not None:
        profiler.enable()
    for n, data in enumerate(chunks):
        now += step
        server.processing = publisher
        session.receive_data(data, now, budget=64)
        publisher._after_processing()
        if n % per_tick == 0:
            server.batch_tick()
    if profiler is not None:
        profiler.disable()
    return time.process_time() - started


def ops_per_chunk(data: bytes) -> int:
    return sum(1 for _ in ws.FrameDecoder(client_frames=True).events(data))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--count", type=int, default=100_000, help="publishes per round")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--subscribers", type=int, default=10_000)
    parser.add_argument("--chunk", type=int, default=16, help="publishes per recv")
    parser.add_argument("--rate", type=float, default=40_000, help="msg/s (batch ticks)")
    parser.add_argument("--profile", action="store_true", help="cProfile the last round")
    args = parser.parse_args()
    server, publisher, subscribers, mask = build(args.subscribers)
    figures: list[float] = []
    writes = 0
    for r in range(args.rounds):
        chunks = publish_chunks(args.count, args.subscribers, args.chunk, mask)
        before = sum(c.sock.writes for c in subscribers)  # type: ignore[attr-defined]
        last = args.profile and r == args.rounds - 1
        profiler = cProfile.Profile() if last else None
        cpu = publish(server, publisher, chunks, args.rate, profiler)
        writes = sum(c.sock.writes for c in subscribers) - before  # type: ignore[attr-defined]
        stats: Any = server.ctx.stats
        assert not publisher.session.closing and stats.publishes_refused == 0
        assert writes >= args.count, (writes, args.count)  # every message written
        figures.append(cpu / args.count * 1e6)
        if profiler is not None:
            pstats.Stats(profiler).sort_stats("tottime").print_stats(30)
    print(
        f"{args.subscribers:,} subscribers, {args.chunk} publishes per recv: "
        + " ".join(f"{f:.2f}" for f in figures)
        + f" us of CPU per message (median {statistics.median(figures):.2f}); "
        f"{writes / args.count:.2f} subscriber writes per message"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
