#!/usr/bin/env python3
"""Idle-connection benchmark: how much server memory one open WebSocket session costs.

A thin wrapper over ``migratory bench idle`` (migratory/bench/idle.py). Default
load: 10,000 concurrent WebSocket sessions (handshake + native ``connect`` ->
``connected``), held idle. Target: server RSS growth <= 16 KiB per connection, and
every connection still open after the hold and answering a ping.

    .venv/bin/python benchmarks/idle_connections.py [--connections 10000] [--json out.json]
"""

from __future__ import annotations

import sys

from migratory.bench.cli import main

if __name__ == "__main__":
    sys.exit(main(["idle", *sys.argv[1:]]))
