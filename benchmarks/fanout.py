#!/usr/bin/env python3
"""Fan-out benchmark: one server, N WebSocket subscribers of one subject, one publisher.

A thin wrapper over ``migratory bench`` (migratory/bench/): ``benchmarks/fanout.py
ARGS`` runs ``migratory bench fanout --target-p99 50 ARGS``. Default load: 1000
subscribers of ``/bench/fanout``, 100-byte contents at 100 messages/s for 30 s, i.e.
100,000 deliveries/s. Target: every delivery arrives, latency p99 <= 50 ms.

    .venv/bin/python benchmarks/fanout.py [--duration 30] [--set BatchTime=20] [--json out.json]
    .venv/bin/python benchmarks/fanout.py --front-end mqtt [--tls]   # MQTT QoS 0 subscribers
    .venv/bin/python benchmarks/fanout.py --front-end sse [--tls]   # Server-Sent Events (https)
    .venv/bin/python benchmarks/fanout.py --tls   # native WebSocket subscribers over wss://
    .venv/bin/python benchmarks/fanout.py --subscribers 10000 --subjects 10000 --rate 20000

``--subjects N`` puts subscriber i on subject i mod N and the publisher goes
round-robin over the N subjects (issue 13's shape). How it measures: docs/benchmarks.md.
"""

from __future__ import annotations

import sys

from migratory.bench.cli import main

if __name__ == "__main__":
    args = sys.argv[1:]
    sys.exit(main(["fanout", *(["--target-p99", "50"] if "--target-p99" not in args else []),
                   *args]))
