"""What one oversized SUBSCRIBE or UNSUBSCRIBE costs a server's event loop.

A connected MQTT session (in process, a single server's publish path) is fed one packet
of ``--filters`` topic filters (short ones: as many as fit in ``--bytes``, 1 MiB by
default, MaxFrameSize), and the CPU time (thread time) from the bytes in to the
session's answer -- a close for more than MaxSubjectsPerSubscribe, or the UNSUBACK of a
server that did not bound it -- is reported, median of ``--rounds``. The loop does
nothing else meanwhile: every other client waits that long.

    .venv/bin/python benchmarks/mqtt_filter_flood.py [--bytes 1048576] [--rounds 5]

It imports ``migratory`` from ``sys.path``: run it with ``PYTHONPATH=<another checkout>``
to measure that checkout.
"""

from __future__ import annotations

import argparse
import statistics
import time

from mqtt_wire import Wire

from migratory.config import Config
from migratory.entitlement import entitlement_from_config
from migratory.protocol import mqtt
from migratory.protocol.mqtt_encode import encode_packet
from migratory.server.app import build_hub
from migratory.server.context import LocalPublishing, ServerContext, ServerStatistics
from migratory.server.mqtt_session import MqttSession


def packets(size: int) -> tuple[int, dict[str, bytes]]:
    count = size // 10  # "a/<n>" with its 2-byte length, a QoS byte for a SUBSCRIBE
    while True:
        names = [f"a/{i}" for i in range(count)]
        made = {"SUBSCRIBE": encode_packet(mqtt.Subscribe(1, tuple((n, 0) for n in names))),
                "UNSUBSCRIBE": encode_packet(mqtt.Unsubscribe(1, tuple(names)))}
        if max(map(len, made.values())) <= size:
            return count, made
        count = count * 9 // 10


def one(packet: bytes, size: int) -> tuple[float, str]:
    config = Config.from_mapping({"MaxFrameSize": str(size + 16)})
    hub = build_hub(config)
    ctx = ServerContext(config, hub, entitlement_from_config(config), ServerStatistics(),
                        LocalPublishing(hub))
    session = MqttSession(ctx, Wire(), "127.0.0.1:1", {})  # type: ignore[arg-type]
    session.receive_data(encode_packet(mqtt.Connect("flood", clean_session=False)), 0.0)
    start = time.thread_time()
    session.receive_data(packet, 0.0)
    while session.process(0.0, 1000):
        pass
    spent = time.thread_time() - start
    return spent, "closed" if session.closing else "answered"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--bytes", type=int, default=1 << 20)
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    count, made = packets(args.bytes)
    for kind, packet in made.items():
        runs = [one(packet, args.bytes) for _ in range(args.rounds)]
        print(f"{kind} of {count} filters, {len(packet)} bytes: "
              f"{statistics.median(t for t, _ in runs) * 1000:.1f} ms CPU (median of "
              f"{args.rounds}), {runs[0][1]}")

if __name__ == "__main__":
    main()
