"""What a discarded persistent MQTT session leaves behind on a member, in one process.

``--sessions`` client ids each open a persistent session (one filter), leave, and come
back with a clean session, which discards the stored one (an empty record, published as
a retained message); the caches then expire. Prints the memory still traced per client
id (tracemalloc) and the hub's subjects, before and after the expiry sweep
(``SessionExpiry``), which forgets the empty records' subjects::

    .venv/bin/python benchmarks/mqtt_discarded_sessions.py --sessions 5000

(Before a change, the same script against the older tree: ``PYTHONPATH=/tmp/before``.)
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
from migratory.server.mqtt_expiry import SessionExpiry
from migratory.server.mqtt_session import MqttSession


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sessions", type=int, default=5000)
    args = parser.parse_args()
    config = Config.from_mapping({"MqttSessionExpiry": "3600", "CacheExpireTime": "10"})
    hub = build_hub(config)
    ctx = ServerContext(config, hub, entitlement_from_config(config), ServerStatistics(),
                        LocalPublishing(hub))
    registry: dict[str, MqttSession] = {}

    def connect(client_id: str, clean: bool) -> MqttSession:
        session = MqttSession(ctx, Wire(), "127.0.0.1:1", registry)
        session.receive_data(encode_packet(mqtt.Connect(client_id, clean_session=clean)), 0.0)
        return session

    gc.collect()
    tracemalloc.start()
    base = tracemalloc.get_traced_memory()[0]
    for i in range(args.sessions):
        device = connect(f"device-{i:06d}", clean=False)
        device.receive_data(encode_packet(mqtt.Subscribe(1, (("a/+", 1),))), 0.0)
        device.connection_lost()
        connect(f"device-{i:06d}", clean=True).connection_lost()  # discards the session
    hub.expire(11.0)
    gc.collect()
    kept = tracemalloc.get_traced_memory()[0] - base
    print(f"{args.sessions} sessions discarded, caches expired: {hub.subject_count} subjects, "
          f"{kept / args.sessions:.0f} B traced per client id")
    expiry = SessionExpiry(ctx, registry)
    for _ in range(3):  # a whole sweep (its budget: every subject)
        expiry.sweep(11.0, hub.subject_count + 1)
    gc.collect()
    kept = tracemalloc.get_traced_memory()[0] - base
    print(f"after the expiry sweep: {hub.subject_count} subjects, "
          f"{kept / args.sessions:.0f} B traced per client id")


if __name__ == "__main__":
    main()
