#!/usr/bin/env python3
"""The CPU of one ``Hub.tick`` (every 100 ms, on the event loop) with many conflated
subscriptions, idle and with a message waiting, in thread time (one process, the hub
alone: no sockets).

    .venv/bin/python benchmarks/conflation_tick.py [--subscriptions 100000] [--busy 1000]

It imports ``migratory`` from ``sys.path``: run it with ``PYTHONPATH=<another checkout>``
to measure that checkout's hub.
"""

from __future__ import annotations

import argparse
import json
import time

import migratory
from migratory.model.message import Message
from migratory.protocol import ops
from migratory.server.hub import Hub


class Sink:
    def deliver(self, frame: bytes) -> None:
        pass


def tick_ms(hub: Hub, now: float) -> float:
    started = time.thread_time()
    hub.tick(now)
    return round((time.thread_time() - started) * 1000, 3)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--subscriptions", type=int, default=100_000)
    parser.add_argument("--busy", type=int, default=1000, help="subjects then published")
    args = parser.parse_args()
    hub = Hub(epoch=1)
    sinks = [Sink() for _ in range(1000)]
    for i in range(args.subscriptions):
        request = ops.SubscriptionRequest(f"/c/s{i}", conflation_ms=500)
        hub.subscribe(sinks[i % len(sinks)], request, 0.0)
    idle = max(tick_ms(hub, 1.0 + k / 10) for k in range(5))
    for i in range(args.busy):
        hub.publish(Message(f"/c/s{i}", b"x"), 1.45)
    waiting = tick_ms(hub, 1.48)  # messages waiting, their period not over
    emitting = tick_ms(hub, 1.5)  # their period's end (1.5 s): each emits
    print(json.dumps({"migratory": migratory.__file__, "subscriptions": args.subscriptions,
                      "idle_tick_ms_max": idle, "busy": args.busy,
                      "waiting_tick_ms": waiting, "emitting_tick_ms": emitting}))


if __name__ == "__main__":
    main()
