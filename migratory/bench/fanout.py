"""The message patterns: fan-out, many subjects, publish-with-ack.

One publisher process (raw socket, absolute schedule, stamped contents) and
``--procs`` subscriber processes (raw sockets in one epoll each, stamps counted
in the byte stream, never decoded). Subscriber i takes subject i mod N and the
publisher goes round-robin over the N subjects, so:

* fan-out: N = 1, every subscriber on one subject;
* many-subjects: N = subscribers (one subject each) or subscribers / K (K per subject);
* publish-with-ack: no subscribers, every publish acknowledged (``PUBLISH_OK``
  natively, PUBACK over MQTT); the latency is the acknowledgement's.

Each subscriber confirms its subscription before the publisher starts; after the
last publish the subscribers drain for at most ``--drain`` s. The server's CPU
and RSS are read from /proc when its process is on this machine.
"""

from __future__ import annotations

import argparse
import functools
import multiprocessing as mp
import multiprocessing.connection as mpc
import sys
import time
from collections import Counter
from collections.abc import Callable
from multiprocessing.process import BaseProcess
from typing import Any

from migratory.bench.fanout_report import summarise
from migratory.bench.loadgen import receive, split
from migratory.bench.mqttraw import mqtt_subscriber_main
from migratory.bench.procfs import CpuMeter, rss_kib
from migratory.bench.progress import Progress, wait_for_all
from migratory.bench.publisher import publisher_main
from migratory.bench.sse import sse_subscriber_main
from migratory.bench.subscriber import subscriber_main
from migratory.bench.swarm import swarm_main
from migratory.bench.target import Target
from migratory.bench.workers import all_workers_stats, worker_pids


def start_subscribers(
    args: argparse.Namespace, target: Target, procs: list[BaseProcess], lifetime: float
) -> list[mpc.Connection]:
    ctx = mp.get_context("fork")
    front_end = "mqtt" if target.protocol == "mqtt" else args.front_end
    port = target.port_for(front_end)
    main: Callable[..., None] = {"mqtt": mqtt_subscriber_main, "sse": sse_subscriber_main}.get(
        front_end, subscriber_main
    )
    if args.tls_port:
        port = args.tls_port
    if getattr(args, "swarm", None) == "c":
        main = functools.partial(swarm_main, front_end=front_end, binary=args.swarm_binary)
    pipes = []
    for k, (first, count) in enumerate(split(args.subscribers, args.procs)):
        parent_end, child_end = ctx.Pipe()
        proc = ctx.Process(
            target=main,
            args=(child_end, target.host, port, first, count, args.setup_timeout, lifetime,
                  args.subjects, args.ca_file),
            name=f"subscribers-{k}",
            daemon=True,
        )
        proc.start()
        child_end.close()
        procs.append(proc)
        pipes.append(parent_end)
    return pipes


def run(args: argparse.Namespace, target: Target, procs: list[BaseProcess]) -> dict[str, Any]:
    """One run of the pattern in ``args`` against ``target``; the result (summarised)."""
    ctx = mp.get_context("fork")
    lifetime = args.setup_timeout + args.duration * 2 + args.drain + 120
    sub_pipes = start_subscribers(args, target, procs, lifetime) if args.subscribers else []
    pub_protocol = "mqtt" if target.protocol == "mqtt" else args.publisher
    pub_port = target.port_for(pub_protocol)  # the same listeners as subscribers
    args.publisher = pub_protocol
    args.front_end = "mqtt" if target.protocol == "mqtt" else args.front_end
    pub_pipe, child_end = ctx.Pipe()
    pub = ctx.Process(
        target=publisher_main,
        args=(child_end, target.host, pub_port, args.size, args.ack, args.setup_timeout,
              args.subjects, pub_protocol),
        name="publisher",
        daemon=True,
    )
    pub.start()
    child_end.close()
    procs.append(pub)

    t_setup = time.monotonic()
    ready = receive(sub_pipes, "ready", args.setup_timeout + 30)
    (pub_ready,) = receive([pub_pipe], "ready", args.setup_timeout + 30)
    subscribed = sum(r[1] for r in ready)
    setup_failures: Counter[str] = Counter()
    for r in [*ready, pub_ready]:
        setup_failures.update(r[2])
    setup_seconds = time.monotonic() - t_setup
    print(
        f"{target.name}: {subscribed}/{args.subscribers} subscribers confirmed in "
        f"{setup_seconds:.1f} s; publisher {'ready' if pub_ready[1] else 'FAILED'}"
        + (f"; failures {dict(setup_failures)}" if setup_failures else ""),
        file=sys.stderr,
        flush=True,
    )
    if not pub_ready[1]:
        raise RuntimeError(f"publisher could not connect: {pub_ready[2]}")

    pids = {"server": target.pid} if target.pid else {}
    if target.pid:  # Workers > 1: the worker processes under the server (docs/workers.md)
        pids.update(worker_pids(target.pid))
    workers = max(1, sum(name.startswith("server-worker") for name in pids))
    pids["publisher"] = pub.pid or 0
    pids.update({proc.name: proc.pid or 0 for proc in procs if proc is not pub})
    for k, r in enumerate(ready):  # the C swarm's binary, under each subscriber process
        if len(r) > 4:
            pids[f"subscribers-c-{k}"] = r[4]

    def stats() -> dict[str, Any]:
        if not target.stats:
            return {}
        return all_workers_stats(target.host, target.port, workers) or {}

    def server_rss() -> int | None:
        if not target.pid:
            return None
        return sum(rss_kib(pid) for name, pid in pids.items() if name.startswith("server"))

    meter = CpuMeter(pids)
    figures: dict[str, Any] = {
        "subscribed": subscribed,
        "setup_failures": dict(setup_failures),
        "setup_seconds": setup_seconds,
        "rss_before": server_rss(),
        "stats_before": stats(),
    }
    meter.start()
    window_start = time.monotonic()
    pub_pipe.send(("go", args.rate, args.duration, args.drain))
    label = f"{target.name} {args.pattern}: {args.rate:g} msg/s x {args.size} B"
    progress = Progress(args.duration, label, enabled=None if args.progress else False)
    deadline = window_start + args.duration * 2 + args.drain + 60
    wait_for_all([pub_pipe], progress, deadline - window_start)
    (done,) = receive([pub_pipe], "done", max(deadline - time.monotonic(), 1.0))
    figures["cpu"] = meter.stop()
    figures["window"] = (window_start, time.monotonic())
    figures["stats_after"] = stats()
    figures["published"] = done[1]
    for pipe in sub_pipes:
        pipe.send(("finish", done[1]["sent"], args.drain))
    figures["results"] = [r[1] for r in receive(sub_pipes, "result", args.drain + 30)]
    figures["rss_after"] = server_rss()
    for proc in procs:
        proc.join(5)
    return summarise(args, figures)
