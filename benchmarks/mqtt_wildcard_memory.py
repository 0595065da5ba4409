#!/usr/bin/env python3
"""What one MQTT '#' session holds once the hub dropped the messages it delivered: one
message on each of N subjects, then the hub expires and forgets them all (tracemalloc,
in process, no sockets). docs/mqtt.md, "In memory".

    .venv/bin/python benchmarks/mqtt_wildcard_memory.py [--subjects 1024] [--size 1000000]
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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--subjects", type=int, default=1024)
    parser.add_argument("--size", type=int, default=1_000_000, help="content bytes")
    args = parser.parse_args()
    config = Config.from_mapping({
        "MaxPublishesPerSecond": "0", "CacheExpireTime": "1",
        "MaxMessageSize": str(2 * args.size), "MaxFrameSize": str(4 * args.size),
    })
    hub = build_hub(config)
    ctx = ServerContext(config, hub, entitlement_from_config(config), ServerStatistics(),
                        LocalPublishing(hub))
    registry: dict[str, MqttSession] = {}
    publisher = MqttSession(ctx, Wire(), "bench", registry)
    device = MqttSession(ctx, Wire(), "bench", registry)
    publisher.receive_data(encode_packet(mqtt.Connect("pub")), 0.0)
    device.receive_data(encode_packet(mqtt.Connect("dev")), 0.0)
    device.receive_data(encode_packet(mqtt.Subscribe(1, (("dev/#", 0),))), 0.0)
    gc.collect()
    tracemalloc.start()
    base = tracemalloc.get_traced_memory()[0]
    for i in range(args.subjects):
        content = f"{i:05d}".encode() + bytes(args.size)
        publisher.receive_data(encode_packet(mqtt.Publish(f"dev/d{i}", content)), 0.0)
        device.outbox.take()
        if publisher.outbox:
            publisher.outbox.take()
    gc.collect()
    live = tracemalloc.get_traced_memory()[0] - base
    hub.expire(10.0)  # every message expired: the subjects are forgotten
    gc.collect()
    left = tracemalloc.get_traced_memory()[0] - base
    print(f"{args.subjects} subjects x {args.size} B to one '#' session: {live / 1e6:.1f} MB "
          f"while the hub knows them, {left / 1e6:.2f} MB once it expired and forgot them "
          f"({len(device.settle_reached())} positions)")


if __name__ == "__main__":
    main()
