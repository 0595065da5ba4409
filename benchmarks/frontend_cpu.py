#!/usr/bin/env python3
"""Server and subscriber CPU per delivery on each front end (native, SSE, MQTT; plain, TLS).

The real server (``Server``: listeners, connections, sessions, hub, outboxes, TLS) runs in
this process; the fan-out benchmark's own subscriber processes (migratory/bench/: raw
sockets counting stamps) connect to it. Nothing publishes over the network: the loop
calls ``hub.publish`` ``--per-write`` times, then the batch tick (``Server.batch_tick``,
one write per connection), then sleeps ``--pause`` ms so the subscribers keep up. The
figure is this process's CPU time (``time.process_time``) over the loop divided by the
deliveries: it holds on a busy machine, unlike a latency figure. The ``load`` column is
the subscriber processes' CPU time (from /proc) over the same loop, per delivery: the
load generator's side of each delivery. BatchTime is set out of
the way (10 s) and BatchIdleWrite off, so the loop alone decides what one write carries:
at the product's BatchTime of 10 ms, 100 and 400 messages/s to one subject are about 1
and 4 messages per write. Every subscriber must receive every message (checked).

    .venv/bin/python benchmarks/frontend_cpu.py                       # all six, 1 and 4 per write
    .venv/bin/python benchmarks/frontend_cpu.py --front-end sse --per-write 4 --profile
"""

from __future__ import annotations

import argparse
import cProfile
import multiprocessing as mp
import pstats
import sys
import time
from dataclasses import dataclass

import trio

from migratory.bench.cli import tls_setup
from migratory.bench.loadgen import receive, split, stop_processes
from migratory.bench.mqttraw import mqtt_subscriber_main
from migratory.bench.procfs import cpu_seconds, raise_nofile
from migratory.bench.sse import sse_subscriber_main
from migratory.bench.stamp import MARK, STAMP_END, SUBJECT
from migratory.bench.subscriber import subscriber_main
from migratory.config import Config
from migratory.model.message import Message
from migratory.server.app import Server

FRONT_ENDS = ("native", "sse", "mqtt", "native-tls", "sse-tls", "mqtt-tls")


@dataclass(frozen=True)
class Figure:
    front_end: str
    per_write: int
    deliveries: int
    fan_out_us: float  # CPU per delivery in hub.publish (hub, sessions, outboxes)
    write_us: float  # CPU per delivery in the batch tick (joining, TLS, send)
    total_us: float  # CPU per delivery over the whole loop (sleeps' scheduling included)
    load_us: float  # the subscriber processes' CPU per delivery over the loop (/proc)
    writes: int
    delivered: bool


def settings_for(front_end: str, tls: tuple[int, list[str]] | None) -> dict[str, str]:
    settings = {
        "Listen": "127.0.0.1:0", "BatchTime": "10000", "BatchIdleWrite": "false",
        "MaxConnectionsPerAddress": "0", "MaxHandshakesPerAddress": "0",
        "MaxConnectionRatePerAddress": "0", "MaxTlsHandshakeRate": "0",
        "MaxPublishesPerSecond": "0", "LogLevel": "WARNING",
    }
    if front_end.startswith("mqtt"):
        settings["ListenMqtt"] = "127.0.0.1:0"
    if tls is not None:
        for item in tls[1]:
            key, _, value = item.partition("=")
            settings[key] = value
    return settings


def content(size: int) -> bytes:
    return MARK + b"%019d" % time.monotonic_ns() + b"x" * (size - STAMP_END)


async def measure(args: argparse.Namespace, front_end: str) -> list[Figure]:
    tls = None
    ca_file = None
    if front_end.endswith("-tls"):
        key = "ListenMqttEncrypted" if front_end.startswith("mqtt") else "ListenEncrypted"
        port, ca_file, tls_settings = tls_setup(key)
        tls = (port, tls_settings)
    server = Server(Config.from_mapping(settings_for(front_end, tls)))
    procs: list[mp.Process] = []
    async with trio.open_nursery() as nursery:
        await nursery.start(server.serve)
        host = "127.0.0.1"
        if tls is not None:
            port = tls[0]
        elif front_end == "mqtt":
            port = server.mqtt_addresses[0][1]
        else:
            port = server.addresses[0][1]
        target = {"native": subscriber_main, "sse": sse_subscriber_main,
                  "mqtt": mqtt_subscriber_main}[front_end.removesuffix("-tls")]
        ctx = mp.get_context("fork")
        pipes = []
        for first, count in split(args.subscribers, args.procs):
            parent_end, child_end = ctx.Pipe()
            proc = ctx.Process(
                target=target,
                args=(child_end, host, port, first, count, 60.0, 600.0, 1, ca_file),
                daemon=True,
            )
            proc.start()
            child_end.close()
            procs.append(proc)
            pipes.append(parent_end)
        try:
            ready = await trio.to_thread.run_sync(receive, pipes, "ready", 90)
            subscribed = sum(r[1] for r in ready)
            if subscribed != args.subscribers:
                raise RuntimeError(f"{front_end}: {subscribed} subscribed, {ready}")
            await trio.sleep(0.5)  # the last SUBSCRIBE_ALLOWs written and read
            figures = []
            sent = 0
            for per_write in args.per_write:
                figure, published = await loop(
                    args, server, front_end, per_write, [p.pid or 0 for p in procs]
                )
                sent += published
                figures.append(figure)
            for pipe in pipes:
                pipe.send(("finish", sent, 10.0))
            results = [r[1] for r in await trio.to_thread.run_sync(receive, pipes, "result", 40)]
            received = sum(r["received"] for r in results)
            delivered = received == sent * args.subscribers
            if not delivered:
                print(f"  {front_end}: {received} of {sent * args.subscribers} delivered: "
                      f"{[r['closes'] for r in results]}", flush=True)
            return [Figure(**{**f.__dict__, "delivered": delivered}) for f in figures]
        finally:
            stop_processes(procs)  # type: ignore[arg-type]
            nursery.cancel_scope.cancel()


async def loop(
    args: argparse.Namespace, server: Server, front_end: str, per_write: int, load: list[int]
) -> tuple[Figure, int]:
    hub = server.ctx.hub
    stats = server.ctx.stats
    publish_cpu = write_cpu = 0.0
    writes = stats.writes
    profile = cProfile.Profile() if args.profile else None
    clock = time.process_time
    load_started = sum(map(cpu_seconds, load))
    started = clock()
    for _ in range(args.batches):
        if profile is not None:
            profile.enable()
        t0 = clock()
        for _ in range(per_write):
            hub.publish(Message(SUBJECT, content(args.size)), trio.current_time())
        t1 = clock()
        server.batch_tick()
        t2 = clock()
        if profile is not None:
            profile.disable()
        publish_cpu += t1 - t0
        write_cpu += t2 - t1
        await trio.sleep(args.pause / 1000)
    total = clock() - started
    await trio.sleep(0.2)  # the subscribers read the last batch
    load_cpu = sum(map(cpu_seconds, load)) - load_started
    published = args.batches * per_write
    deliveries = published * args.subscribers
    figure = Figure(
        front_end, per_write, deliveries, 1e6 * publish_cpu / deliveries,
        1e6 * write_cpu / deliveries, 1e6 * total / deliveries, 1e6 * load_cpu / deliveries,
        stats.writes - writes, True,
    )
    if profile is not None:
        print(f"--- profile: {front_end}, {per_write} per write", flush=True)
        pstats.Stats(profile).sort_stats("tottime").print_stats(18)
    return figure, published


async def run_all(args: argparse.Namespace) -> list[Figure]:
    figures = []
    for front_end in args.front_end:
        figures.extend(await measure(args, front_end))
    return figures


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--front-end", action="append", choices=FRONT_ENDS)
    parser.add_argument("--subscribers", type=int, default=1000)
    parser.add_argument("--procs", type=int, default=2)
    parser.add_argument("--per-write", type=int, action="append",
                        help="messages per batch tick (repeatable; default 1 and 4)")
    parser.add_argument("--batches", type=int, default=200)
    parser.add_argument("--pause", type=float, default=10.0, help="ms between batch ticks")
    parser.add_argument("--size", type=int, default=100)
    parser.add_argument("--profile", action="store_true", help="cProfile the loop")
    args = parser.parse_args(argv)
    args.front_end = args.front_end or list(FRONT_ENDS)
    args.per_write = args.per_write or [1, 4]
    if args.size < STAMP_END + 1:
        parser.error(f"--size must be at least {STAMP_END + 1}")
    raise_nofile()
    figures = trio.run(run_all, args)
    print(f"{'front end':10} {'msgs/write':>10} {'deliveries':>10} {'fan-out':>8} "
          f"{'write':>8} {'total':>8} {'load':>8}  us CPU per delivery (load: the subscriber "
          "processes); writes; all delivered")
    for f in figures:
        print(f"{f.front_end:10} {f.per_write:>10} {f.deliveries:>10} {f.fan_out_us:8.2f} "
              f"{f.write_us:8.2f} {f.total_us:8.2f} {f.load_us:8.2f}  {f.writes}; {f.delivered}")
    return 0 if all(f.delivered for f in figures) else 1


if __name__ == "__main__":
    sys.exit(main())
