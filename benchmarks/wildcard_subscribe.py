#!/usr/bin/env python3
"""The event-loop stop of one MQTT wildcard SUBSCRIBE on a server of many subjects, in CPU
time (thread time: a figure the machine's load inflates little), measured in one process on
a real :class:`MqttSession` and hub (no sockets).

The hub holds ``--subjects`` retained subjects ``/g<i % 1000>/d<i>/t``. For each filter a
fresh session SUBSCRIBEs once; its input is processed the way the connection does it
(:data:`OPERATIONS_PER_TURN` packets' worth of work per loop turn, the other clients'
turn between two), and each turn is timed. The longest turn is the stop every other
client of the server waited through. Reported per filter: the longest turn, the total,
the turns, the retained messages delivered and the SUBACK. Last, a persistent '#'
session that missed a message on every subject reconnects (``--no-resume``: not).

    .venv/bin/python benchmarks/wildcard_subscribe.py [--subjects 50000,500000]

It imports ``migratory`` from ``sys.path``: run it with ``PYTHONPATH=<another checkout>``
to measure that checkout's server.
"""

from __future__ import annotations

import argparse
import gc
import json
import resource
import time
from typing import Any

import migratory
from migratory.config import Config
from migratory.entitlement import entitlement_from_config
from migratory.model.message import Message
from migratory.protocol import mqtt
from migratory.protocol.mqtt_encode import encode_packet
from migratory.server.app import build_hub
from migratory.server.context import LocalPublishing, ServerContext, ServerStatistics
from migratory.server.mqtt_session import MqttSession

OPERATIONS_PER_TURN = 64  # migratory.server.connection
FILTERS = ("g7/+/t", "+/d123/t", "g7/#", "+/+/t", "#")


class Link:
    """What an MqttSession writes through: nothing (the outbox is read and dropped)."""

    writing = False

    def mark_dirty(self) -> None:
        pass

    def flush_now(self) -> None:
        pass


def build(subjects: int) -> ServerContext:
    config = Config.from_mapping({"MaxPublishesPerSecond": "0"})
    hub = build_hub(config)
    ctx = ServerContext(config, hub, entitlement_from_config(config), ServerStatistics(),
                        LocalPublishing(hub))
    for i in range(subjects):
        hub.publish(Message(f"/g{i % 1000}/d{i}/t", b"x" * 20, retained=True), 0.0)
    return ctx


def subscribe_turns(ctx: ServerContext, number: int, topic_filter: str) -> dict[str, Any]:
    session = MqttSession(ctx, Link(), "127.0.0.1:1", {})  # type: ignore[arg-type]
    session.receive_data(encode_packet(mqtt.Connect(f"bench{number}")), 0.0)
    session.outbox.take()
    turns: list[float] = []
    delivered = 0
    suback = None
    more = True
    data: bytes | None = encode_packet(mqtt.Subscribe(1, ((topic_filter, 0),)))
    while more and len(turns) < 100_000:
        started = time.thread_time()
        if data is not None:
            more = session.receive_data(data, 0.0, budget=OPERATIONS_PER_TURN)
            data = None
        else:
            more = session.process(0.0, OPERATIONS_PER_TURN)
        turns.append(time.thread_time() - started)
        out = session.outbox.take() if session.outbox else b""
        for packet in mqtt.MqttDecoder(server=False).events(out):
            if isinstance(packet, mqtt.Publish):
                delivered += 1
            elif isinstance(packet, mqtt.Suback):
                suback = packet.return_codes
    session.connection_lost()
    return {
        "filter": topic_filter,
        "longest_turn_ms": round(max(turns) * 1000, 2),
        "total_ms": round(sum(turns) * 1000, 1),
        "turns": len(turns),
        "retained_delivered": delivered,
        "suback": suback,
    }


def resume_turns(ctx: ServerContext, subjects: int) -> dict[str, Any]:
    """A persistent '#' session that missed a message on every subject reconnects: its
    CONNECT's turns, as subscribe_turns times a SUBSCRIBE's."""
    registry: dict[str, MqttSession] = {}
    session = MqttSession(ctx, Link(), "127.0.0.1:1", registry)  # type: ignore[arg-type]
    session.receive_data(encode_packet(mqtt.Connect("resumer", clean_session=False)), 0.0)
    more = session.receive_data(encode_packet(mqtt.Subscribe(1, (("#", 0),))), 0.0,
                                budget=OPERATIONS_PER_TURN)
    while more:  # its retained messages, read as they come
        session.outbox.take()
        more = session.process(0.0, OPERATIONS_PER_TURN)
    session.outbox.take()
    session.connection_lost()
    for i in range(subjects):
        ctx.hub.publish(Message(f"/g{i % 1000}/d{i}/t", b"y" * 20), 1.0)
    back = MqttSession(ctx, Link(), "127.0.0.1:1", registry)  # type: ignore[arg-type]
    turns: list[float] = []
    delivered = 0
    data: bytes | None = encode_packet(mqtt.Connect("resumer", clean_session=False))
    more = True
    while more and len(turns) < 100_000:
        started = time.thread_time()
        if data is not None:
            more = back.receive_data(data, 0.0, budget=OPERATIONS_PER_TURN)
            data = None
        else:
            more = back.process(0.0, OPERATIONS_PER_TURN)
        turns.append(time.thread_time() - started)
        out = back.outbox.take() if back.outbox else b""
        delivered += sum(isinstance(p, mqtt.Publish)
                         for p in mqtt.MqttDecoder(server=False).events(out))
    return {"filter": "# (resume)", "longest_turn_ms": round(max(turns) * 1000, 2),
            "total_ms": round(sum(turns) * 1000, 1), "turns": len(turns),
            "missed_delivered": delivered}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--subjects", default="50000,500000")
    parser.add_argument("--filters", default=",".join(FILTERS))
    parser.add_argument("--resume", action=argparse.BooleanOptionalAction, default=True,
                        help="also a persistent '#' session resuming (last: it publishes)")
    args = parser.parse_args()
    print(f"# migratory from {migratory.__file__}")
    for subjects in (int(s) for s in args.subjects.split(",")):
        started = time.perf_counter()
        ctx = build(subjects)
        gc.collect()
        gc.freeze()  # as the server does after start-up: no full collection in a turn
        built = time.perf_counter() - started
        rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss // 1024
        print(json.dumps({"subjects": subjects, "build_s": round(built, 1),
                          "max_rss_mb": rss}))
        for number, topic_filter in enumerate(args.filters.split(",")):
            print(json.dumps({"subjects": subjects,
                              **subscribe_turns(ctx, number, topic_filter)}))
        if args.resume:
            print(json.dumps({"subjects": subjects, **resume_turns(ctx, subjects)}))
        del ctx
        gc.unfreeze()
        gc.collect()


if __name__ == "__main__":
    main()
