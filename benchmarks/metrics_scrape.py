#!/usr/bin/env python3
"""CPU time of one ``GET /metrics`` with many client connections open.

The real :class:`~migratory.server.app.Server` and its :class:`Monitor` answer the
scrape; the open connections are stand-ins, each holding a real session's outbox
(with a few frames queued) and a front end, entered as the server enters a
connection it accepted. Measured in CPU time (``time.process_time``), so it holds on
a busy machine: what a scrape takes from the member's event loop.

    .venv/bin/python benchmarks/metrics_scrape.py [--connections 100000] [--scrapes 50]
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path
from types import SimpleNamespace

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from migratory.config import Config
from migratory.model.outbox import Outbox
from migratory.protocol.http import Request
from migratory.server.app import Server

FRONTENDS = ("websocket", "websocket", "websocket", "mqtt", "sse", "http")


class StandIn:
    """What a scrape may read of a connection: its session (outbox, front end) and the
    front end it is counted under."""

    __slots__ = ("frontend", "session")

    def __init__(self, session: SimpleNamespace, frontend: str) -> None:
        self.session = session
        self.frontend = frontend


def server_with(connections: int) -> Server:
    server = Server(Config.from_mapping({"Listen": "127.0.0.1:0"}, source="benchmark"))
    budget = server.ctx.outbox_budget
    for number in range(connections):
        outbox = Outbox(batch_space=65536, max_pending=4 << 20, budget=budget)
        for _ in range(number % 4):
            outbox.enqueue(b"x" * 130)
        frontend = FRONTENDS[number % len(FRONTENDS)]
        stand_in = StandIn(SimpleNamespace(outbox=outbox, frontend=frontend), frontend)
        server.connections.add(stand_in)  # type: ignore[arg-type]
        counts = getattr(server, "frontends", None)  # kept as connections come and go
        if counts is not None:
            counts.opened(frontend)
    return server


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--connections", type=int, default=100_000)
    parser.add_argument("--scrapes", type=int, default=50)
    args = parser.parse_args()
    server = server_with(args.connections)
    request = Request("GET", "/metrics", "/metrics", {}, ())
    answer = server.monitor.route(request, monitoring_listener=True)
    assert answer is not None and answer.startswith(b"HTTP/1.1 200"), answer[:80]
    start = time.process_time()
    for _ in range(args.scrapes):
        server.monitor.route(request, monitoring_listener=True)
    per_scrape = (time.process_time() - start) / args.scrapes
    print(f"GET /metrics with {args.connections:,} connections: "
          f"{per_scrape * 1e3:.2f} ms of CPU per scrape ({args.scrapes} scrapes, "
          f"{len(answer):,} bytes)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
