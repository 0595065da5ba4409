#!/usr/bin/env python3
"""What MQTT '#' sessions hold per live subject they were delivered: N subjects exist
(one message each, no subscriber), K sessions subscribe to '#', then one more message
on every subject reaches each of them (tracemalloc, in process, no sockets; the hub
keeps one message per subject, so its own memory stays as it was). With --retained
the N messages are retained and what is measured is the SUBSCRIBE: the peak while its
retained messages go out (each session's outbox taken after every slice) and what is
held after. docs/mqtt.md, "In memory"; docs/benchmarks.md, "MQTT session positions".

    .venv/bin/python benchmarks/mqtt_session_positions.py [--subjects 200000] [--sessions 4]
        [--persistent] [--retained] [--set MqttSessionMaxSubjects=10000]
"""

from __future__ import annotations

import argparse
import gc
import tracemalloc

from mqtt_wire import Wire

from migratory.config import Config
from migratory.entitlement import entitlement_from_config
from migratory.protocol import mqtt
from migratory.protocol.mqtt_encode import encode_packet
from migratory.server.app import build_hub
from migratory.server.context import LocalPublishing, ServerContext, ServerStatistics
from migratory.server.mqtt_session import MqttSession


def publish_all(publisher: MqttSession, sessions: list[MqttSession], subjects: int,
                round_: int, *, retain: bool = False) -> None:
    for start in range(0, subjects, 1000):
        publisher.receive_data(b"".join(
            encode_packet(mqtt.Publish(f"dev/d{i}", b"%d" % round_, retain=retain))
            for i in range(start, min(start + 1000, subjects))), 0.0)
        for device in sessions:
            if device.outbox:
                device.outbox.take()
        if publisher.outbox:
            publisher.outbox.take()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--subjects", type=int, default=200_000)
    parser.add_argument("--sessions", type=int, default=4)
    parser.add_argument("--persistent", action="store_true", help="clean session 0")
    parser.add_argument("--retained", action="store_true",
                        help="measure a SUBSCRIBE's retained messages going out")
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE")
    args = parser.parse_args()
    if args.retained:
        ctx, registry, _publisher = hub_of(args, retain=True)
        subscribe_retained(ctx, registry, args)
        return
    alone, _ = live_round(args, 0)  # the hub's own share of the round
    grown, sessions = live_round(args, args.sessions)
    per_session = (grown - alone) / max(1, args.sessions)
    positions = len(sessions[0].settle_reached()) if sessions else 0
    print(f"{args.subjects} live subjects, {args.sessions} "
          f"{'persistent' if args.persistent else 'clean'} '#' sessions: "
          f"+{grown / 1e6:.1f} MB (+{alone / 1e6:.1f} MB without them), "
          f"{per_session / 1e6:.2f} MB per session "
          f"({per_session / args.subjects:.0f} B per subject), "
          f"{positions} positions held per session")


def hub_of(args: argparse.Namespace, *, retain: bool = False
           ) -> tuple[ServerContext, dict[str, MqttSession], MqttSession]:
    """A hub of ``args.subjects`` subjects of one message each, and their publisher."""
    settings = {"MaxPublishesPerSecond": "0", "MaxCachedMessagesPerSubject": "1"}
    settings.update(item.split("=", 1) for item in args.set)
    config = Config.from_mapping(settings)
    hub = build_hub(config)
    ctx = ServerContext(config, hub, entitlement_from_config(config), ServerStatistics(),
                        LocalPublishing(hub))
    registry: dict[str, MqttSession] = {}
    publisher = MqttSession(ctx, Wire(), "bench", registry)
    publisher.receive_data(encode_packet(mqtt.Connect("pub")), 0.0)
    publish_all(publisher, [], args.subjects, 1, retain=retain)
    return ctx, registry, publisher


def live_round(args: argparse.Namespace, count: int) -> tuple[int, list[MqttSession]]:
    """Bytes one more message on every subject leaves held, with ``count`` sessions."""
    ctx, registry, publisher = hub_of(args)
    sessions = []
    for k in range(count):
        device = MqttSession(ctx, Wire(), "bench", registry)
        device.receive_data(encode_packet(mqtt.Connect(
            f"dev{k}", clean_session=not args.persistent)), 0.0)
        device.receive_data(encode_packet(mqtt.Subscribe(1, (("dev/#", 0),))), 0.0)
        while device.subscriptions.busy:
            device.subscriptions.work(10_000)
        sessions.append(device)
    gc.collect()
    tracemalloc.start()
    base = tracemalloc.get_traced_memory()[0]
    publish_all(publisher, sessions, args.subjects, 2)
    for device in sessions:
        device.settle_reached()
    gc.collect()
    grown = tracemalloc.get_traced_memory()[0] - base
    tracemalloc.stop()
    return grown, sessions


def subscribe_retained(ctx: ServerContext, registry: dict[str, MqttSession],
                       args: argparse.Namespace) -> None:
    sessions = []
    for k in range(args.sessions):
        device = MqttSession(ctx, Wire(), "bench", registry)
        device.receive_data(encode_packet(mqtt.Connect(
            f"dev{k}", clean_session=not args.persistent)), 0.0)
        sessions.append(device)
    gc.collect()
    tracemalloc.start()
    base = tracemalloc.get_traced_memory()[0]
    tracemalloc.reset_peak()
    for device in sessions:
        device.receive_data(encode_packet(mqtt.Subscribe(1, (("dev/#", 0),))), 0.0,
                            budget=64)
    while any(device.subscriptions.busy for device in sessions):
        for device in sessions:
            device.process(0.0, 64)
            if device.outbox:
                device.outbox.take()
    gc.collect()
    held, peak = (m - base for m in tracemalloc.get_traced_memory())
    tracemalloc.stop()
    print(f"{args.subjects} retained subjects, {args.sessions} "
          f"{'persistent' if args.persistent else 'clean'} '#' SUBSCRIBEs: peak "
          f"+{peak / 1e6:.1f} MB ({peak / max(1, args.sessions) / 1e6:.2f} MB per session), "
          f"+{held / 1e6:.1f} MB held after, "
          f"{len(sessions[0].settle_reached()) if sessions else 0} positions per session")


if __name__ == "__main__":
    main()
