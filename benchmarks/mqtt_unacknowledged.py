"""MQTT subscribers that read every QoS 1 message and never acknowledge one: the memory
they make the server hold, against OutboxMemoryBudget (one server process started here,
on 127.0.0.1).

``--devices`` MQTT connections subscribe to ``a/b`` with QoS 1; one thread reads and
drops whatever comes to them (no PUBACK, ever); a native publisher then sends
``--messages`` guaranteed messages of 10 bytes to /a/b. Reported: the server's RSS
before and at the end, the slow consumers it cut off, and ``/stats`` ``outbox_bytes``
(then three times, 4 s apart)::

    .venv/bin/python benchmarks/mqtt_unacknowledged.py --set ClientMaxPendingBytes=1048576 \\
        --set OutboxMemoryBudget=33554432

docs/benchmarks.md, "QoS 1 messages not acknowledged, outside the budget".
"""

from __future__ import annotations

import argparse
import json
import selectors
import socket
import sys
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parents[1] / "tests" / "server"))
sys.path.insert(0, str(Path(__file__).parent))

from attacks import Server
from mqttclient import MqttRawClient
from rawclient import RawClient

from migratory.model.message import Message, Qos
from migratory.protocol import ops


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def drain(socks: list[socket.socket], stop: threading.Event) -> None:
    selector = selectors.DefaultSelector()
    for sock in socks:
        sock.setblocking(False)
        selector.register(sock, selectors.EVENT_READ)
    while not stop.is_set():
        for key, _ in selector.select(0.2):
            try:
                if not key.fileobj.recv(1 << 20):  # type: ignore[union-attr]
                    selector.unregister(key.fileobj)
            except OSError:
                selector.unregister(key.fileobj)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--devices", type=int, default=300)
    parser.add_argument("--messages", type=int, default=6000)
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE")
    args = parser.parse_args()
    mqtt_port = free_port()
    settings = dict(item.split("=", 1) for item in args.set)
    server = Server(ListenMqtt=f"127.0.0.1:{mqtt_port}", MaxConnectionRatePerAddress="0",
                    MaxPublishesPerSecond="0", **settings)
    stop = threading.Event()
    try:
        devices = []
        for i in range(args.devices):
            device = MqttRawClient(mqtt_port, timeout=30)
            device.connect(f"dev{i}")
            device.subscribe("a/b", qos=1)
            devices.append(device)
        reader = threading.Thread(target=drain, args=([d.sock for d in devices], stop))
        reader.start()
        rss_before = server.rss()
        publisher = RawClient(server.port, timeout=120)
        publisher.connect("publisher")
        started = time.monotonic()
        for n in range(args.messages):
            publisher.send_op(ops.Publish(Message("/a/b", b"0123456789", qos=Qos.GUARANTEED)))
            if n % 200 == 199:
                publisher.send_op(ops.Ping(1))
                while not isinstance(publisher.recv_op(), ops.Pong):
                    pass
        time.sleep(3)
        stats = server.stats()
        later = []  # the cut-off connections linger (5 s at most), then leave the budget
        for _ in range(3):
            time.sleep(4)
            later.append(server.stats()["outbox_bytes"])
        print(json.dumps({
            "devices": args.devices, "messages": args.messages, "settings": settings,
            "publishing_s": round(time.monotonic() - started - 3, 1),
            "rss_before_kib": rss_before, "rss_after_kib": server.rss(),
            "slow_consumers": stats["slow_consumers"], "outbox_bytes": stats["outbox_bytes"],
            "outbox_bytes_every_4_s_later": later,
            "connections_open": server.stats()["connections_open"],
        }))
    finally:
        stop.set()
        server.stop()


if __name__ == "__main__":
    main()
