#!/usr/bin/env python3
"""CPU per delivery in the hub's fan-out, native WebSocket subscribers against MQTT QoS 0
ones, in process: real sessions and the real hub, no sockets (the outboxes are emptied
every 20 messages). CPU time, so the figure holds on a busy machine.

    .venv/bin/python benchmarks/mqtt_fanout_cpu.py [--subscribers 1000] [--messages 500]
        [--subjects N]

``--subjects N`` (N > 1): the MQTT subscribers take ``bench/#`` and the messages go
round-robin over N subjects, so every delivery is of another subject than the last
(``MqttSession.settle_reached`` on each).
"""

from __future__ import annotations

import argparse
import time
from typing import Any

from mqtt_wire import Wire

from migratory.config import Config
from migratory.entitlement import entitlement_from_config
from migratory.entitlement_decisions import ClientIdentity
from migratory.model.message import Message
from migratory.protocol import mqtt, ops
from migratory.protocol.mqtt_encode import encode_packet
from migratory.server.app import build_hub
from migratory.server.context import LocalPublishing, ServerContext, ServerStatistics
from migratory.server.mqtt_session import MqttSession
from migratory.server.session import Session


def build(
    subscribers: int, topic: str = "bench/mqtt"
) -> tuple[ServerContext, list[Any], list[Any]]:
    config = Config.from_mapping({"ClientMaxPendingBytes": str(1 << 30)})
    hub = build_hub(config)
    ctx = ServerContext(config, hub, entitlement_from_config(config), ServerStatistics(),
                        LocalPublishing(hub))
    natives: list[Any] = []
    for _ in range(subscribers):
        session = Session(ctx, Wire(), "bench")
        session.identity = ClientIdentity("bench", None, "bench")
        hub.subscribe(session, ops.SubscriptionRequest("/bench/native"), 0.0)
        natives.append(session)
    registry: dict[str, MqttSession] = {}
    mqtts: list[Any] = []
    for i in range(subscribers):
        session = MqttSession(ctx, Wire(), "bench", registry)
        session.receive_data(encode_packet(mqtt.Connect(f"c{i}")), 0.0)
        session.receive_data(encode_packet(mqtt.Subscribe(1, ((topic, 0),))), 0.0)
        session.outbox.take()
        mqtts.append(session)
    return ctx, natives, mqtts


def per_delivery_us(
    ctx: ServerContext, subject: str, sinks: list[Any], messages: int, subjects: int = 1
) -> float:
    names = [subject] if subjects <= 1 else [f"{subject}/s{n}" for n in range(subjects)]
    started = time.process_time()
    for i in range(messages):
        ctx.hub.publish(Message(names[i % len(names)], b"x" * 100), 0.0)
        if i % 20 == 19:
            for sink in sinks:
                sink.outbox.take()
    return (time.process_time() - started) / (messages * len(sinks)) * 1e6


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--subscribers", type=int, default=1000)
    parser.add_argument("--messages", type=int, default=500)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--subjects", type=int, default=1,
                        help="MQTT: 'bench/#' over this many subjects, round-robin")
    args = parser.parse_args()
    wildcard = args.subjects > 1
    ctx, natives, mqtts = build(args.subscribers, "bench/#" if wildcard else "bench/mqtt")
    for _ in range(args.rounds):
        native = per_delivery_us(ctx, "/bench/native", natives, args.messages)
        mqtt_us = per_delivery_us(ctx, "/bench/mqtt", mqtts, args.messages, args.subjects)
        over = f", MQTT '#' over {args.subjects} subjects" if wildcard else ""
        print(f"CPU per delivery: native {native:.3f} us, MQTT QoS 0 {mqtt_us:.3f} us "
              f"({args.subscribers} subscribers, {args.messages} messages{over})")


if __name__ == "__main__":
    main()
