#!/usr/bin/env python3
"""What monitoring adds to the delivery path, in CPU time (holds on a busy machine).

The fan-out benchmark (``benchmarks/fanout.py``, before/after) is the end-to-end check;
this one isolates what issue 11 put on the hot paths and prices each in CPU time
(``time.process_time``), against the work it rides on:

* per socket write: counting the batch size (``BatchSizes``, inlined in
  ``Connection._write``) against one non-blocking ``send`` of a 130-byte frame;
* per publish: timing it (one clock read, two bucket observations) and the audit check;
* per scrape: rendering ``/metrics`` (``benchmarks/metrics_scrape.py``: the real
  server's, with many connections open).

It then states the share at the fan-out benchmark's load: ``--writes`` socket writes and
``--publishes`` publishes per second, against ``--server-cpu`` (the server's CPU %% in
that benchmark before the change; 79 %% in docs/benchmarks.md).

    .venv/bin/python benchmarks/metrics_cost.py [--writes 100000] [--publishes 100]
"""

from __future__ import annotations

import argparse
import socket
import sys
import time
from collections import deque
from pathlib import Path
from types import SimpleNamespace

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from migratory.server import metric_buckets, metric_figures, metrics

N = 1_000_000


def cpu_per_call(function: object, count: int = N) -> float:
    """Seconds of CPU per call of ``function`` (a no-argument callable), loop included."""
    call = function  # type: ignore[assignment]
    start = time.process_time()
    for _ in range(count):
        call()  # type: ignore[operator]
    return (time.process_time() - start) / count


def write_costs() -> tuple[float, float]:
    """(CPU of the batch-size count per write, CPU of one send of a 130-byte frame)."""
    ctx = SimpleNamespace(batch_sizes=metric_buckets.BatchSizes())
    outbox = deque([b"x" * 130])
    limit = metric_buckets.BatchSizes.LIMIT

    def counted() -> None:  # what Connection._write does before taking the batch
        frames = len(outbox)
        if frames <= limit:
            ctx.batch_sizes.sizes[frames] += 1
        else:
            ctx.batch_sizes.observe(frames)

    def bare() -> None:
        len(outbox)

    added = max(cpu_per_call(counted) - cpu_per_call(bare), 0.0)
    sender, receiver = socket.socketpair()
    sender.setblocking(False)
    receiver.setblocking(False)
    frame = b"x" * 130
    sends = 200_000
    start = time.process_time()
    for number in range(sends):
        sender.send(frame)
        if number % 64 == 63:
            try:
                while receiver.recv(1 << 16):
                    pass
            except BlockingIOError:
                pass
    send = (time.process_time() - start) / sends
    sender.close()
    receiver.close()
    return added, send


def publish_cost() -> float:
    """CPU of timing one acknowledged publish (LocalPublishing) and the audit check."""
    timings = metric_figures.PublishTimings()
    ctx = SimpleNamespace(audit=None)
    clock = time.perf_counter  # trio.current_time is a perf_counter read plus an offset

    def timed() -> None:
        audit = ctx.audit
        if audit is not None:
            return
        elapsed = clock() - 1.0
        timings.fanout.observe(elapsed)
        timings.ack.observe(elapsed)

    return max(cpu_per_call(timed, N // 4) - cpu_per_call(lambda: None, N // 4), 0.0)


class _Source:
    def __init__(self, connections: int) -> None:
        self.timings = metric_figures.PublishTimings()
        self.batch_sizes = metric_buckets.BatchSizes()
        self._connections = connections

    def statistics(self) -> dict[str, object]:
        return {key: 1 for key, _, _, _ in metrics.METRICS}

    def ready(self) -> bool:
        return True

    def frontends(self) -> tuple[dict[str, int], int, int]:
        # kept as connections come and go (migratory/server/frontends.py): no walk over
        # them; benchmarks/metrics_scrape.py measures the real server's scrape
        return {"websocket": self._connections}, 0, 0

    def cluster_metrics(self) -> None:
        return None


def scrape_cost(connections: int) -> float:
    registry = metrics.registry_for(_Source(connections))
    return cpu_per_call(lambda: metrics.render(registry), 200)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--writes", type=float, default=100_000, help="socket writes per s")
    parser.add_argument("--publishes", type=float, default=100, help="publishes per s")
    parser.add_argument("--server-cpu", type=float, default=79, help="server CPU %% before")
    parser.add_argument("--connections", type=int, default=1000)
    parser.add_argument("--scrape-interval", type=float, default=15.0)
    args = parser.parse_args()
    per_write, send = write_costs()
    per_publish = publish_cost()
    per_scrape = scrape_cost(args.connections)
    added = (per_write * args.writes + per_publish * args.publishes
             + per_scrape / args.scrape_interval)
    print(f"per socket write : +{per_write * 1e9:.0f} ns (one 130-byte send: {send * 1e9:.0f} ns)")
    print(f"per publish      : +{per_publish * 1e9:.0f} ns (timing + audit check)")
    print(f"per scrape       : {per_scrape * 1e3:.2f} ms ({args.connections} connections)")
    share = added / (args.server_cpu / 100)
    print(f"at {args.writes:,.0f} writes/s and {args.publishes:,.0f} publishes/s, one scrape "
          f"per {args.scrape_interval:g} s: +{added * 1e3:.1f} ms CPU per s = "
          f"{share * 100:.1f} % of a server using {args.server_cpu:g} % CPU")
    return 0


if __name__ == "__main__":
    sys.exit(main())
