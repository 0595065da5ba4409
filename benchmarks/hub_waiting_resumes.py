"""In one process, the hub's steps around a lagging member's waiting resumes and the
other one-step answers of docs/benchmarks.md, "A lagging member's waiting resumes":

- ``looks``: ``--clients`` resumes waiting on one subject ``--ahead`` messages ahead of a
  member numbered elsewhere, then as many messages applied: the whole time, and the
  longest apply (the one that settles them: answered at once for these sinks, which take
  no hand-over);
- ``live``: ``--clients`` live subscribers of one subject, and a cache sync
  (``Hub.reposition``) that jumps ``--ahead`` messages: its time;
- ``history``: one subscribe asking for the whole history of a subject caching
  ``--ahead`` messages of 100 bytes (best of 3)::

    .venv/bin/python benchmarks/hub_waiting_resumes.py looks --clients 10000 --ahead 900
    .venv/bin/python benchmarks/hub_waiting_resumes.py live --clients 10000 --ahead 400
    .venv/bin/python benchmarks/hub_waiting_resumes.py history --ahead 10000
"""

from __future__ import annotations

import argparse
import json
import time

from migratory.model.message import Message, MessageType, Qos, new_message
from migratory.model.position import Position
from migratory.protocol import ops
from migratory.server.format_sink import send_op
from migratory.server.hub import Hub

SUBJECT = "/Lag/s0"
EPOCH = 7


class Sink:
    __slots__ = ("frames",)

    def __init__(self) -> None:
        self.frames = 0

    def deliver(self, frame: bytes) -> None:
        self.frames += 1


def numbered(seq: int) -> Message:
    return new_message(SUBJECT, b"x" * 100, {}, False, Qos.STANDARD, None, EPOCH, seq,
                       MessageType.UPDATE)


def looks(clients: int, ahead: int) -> dict[str, float]:
    hub = Hub(epoch=EPOCH, numbered_elsewhere=True)
    for seq in range(1, 101):
        hub.apply(numbered(seq), 0.0)
    for _ in range(clients):
        hub.subscribe(Sink(), ops.SubscriptionRequest(
            SUBJECT, position=Position(EPOCH, 100 + ahead)), 0.0)
    longest = 0.0
    started = time.perf_counter()
    for seq in range(101, 101 + ahead):
        one = time.perf_counter()
        hub.apply(numbered(seq), 0.0)
        longest = max(longest, time.perf_counter() - one)
    return {"total_ms": (time.perf_counter() - started) * 1000, "longest_apply_ms": longest * 1000}


def live(clients: int, ahead: int) -> dict[str, float]:
    hub = Hub(epoch=EPOCH, numbered_elsewhere=True)
    for seq in range(1, 301):
        hub.apply(numbered(seq), 0.0)
    for _ in range(clients):
        hub.subscribe(Sink(), ops.SubscriptionRequest(SUBJECT), 0.0)
    cached = [numbered(seq) for seq in range(1, 301 + ahead)]
    started = time.perf_counter()
    hub.reposition(SUBJECT, Position(EPOCH, 300 + ahead), None, cached, 0.0)
    return {"reposition_ms": (time.perf_counter() - started) * 1000}


def history(cached: int) -> dict[str, float]:
    hub = Hub(epoch=EPOCH, max_cached_messages=cached)
    for _ in range(cached):
        hub.publish(Message(SUBJECT, b"x" * 100), 0.0)
    best = float("inf")
    for _ in range(3):
        sink = Sink()
        started = time.perf_counter()
        for op in hub.subscribe(sink, ops.SubscriptionRequest(SUBJECT, history=cached), 0.0):
            send_op(sink, op)
        best = min(best, time.perf_counter() - started)
        hub.unsubscribe(sink, SUBJECT)
    return {"answer_ms": best * 1000}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("what", choices=("looks", "live", "history"))
    parser.add_argument("--clients", type=int, default=10_000)
    parser.add_argument("--ahead", type=int, default=900)
    args = parser.parse_args()
    if args.what == "looks":
        figures = looks(args.clients, args.ahead)
    elif args.what == "live":
        figures = live(args.clients, args.ahead)
    else:
        figures = history(args.ahead)
    print(json.dumps({"what": args.what, "clients": args.clients, "ahead": args.ahead,
                      **{k: round(v, 1) for k, v in figures.items()}}))


if __name__ == "__main__":
    main()
