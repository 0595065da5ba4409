"""What saving persistent MQTT sessions (clean session 0) costs the event loop.

``--sessions`` persistent sessions, each subscribed to ``s<i>/#`` over ``--positions``
subjects of its own (so each record names that many positions: ``--sessions x
--positions`` stored in all), run in one process on a single server's publish path
(LocalPublishing: the record is published to the hub at once; a cluster adds the Raft
entry on top). Then ``--cycles`` cycles, each a second of the sessions' clock
(``mqtt_session.clock`` is advanced, no sleeping): one message to one subject of each
session, so each record has one position changed and is saved once (SAVE_INTERVAL).

Reported per cycle (median and max over the cycles): the CPU time of the cycle (thread
time), the longest gap of the trio loop (a 1 ms ticker; wall time, so the machine's load
inflates it), and what the saves published: records, fields and bytes (content plus
field names and values).

    .venv/bin/python benchmarks/mqtt_session_save.py [--sessions 50] [--positions 10000]

It imports ``migratory`` from ``sys.path``: run it with ``PYTHONPATH=<another checkout>``
to measure that checkout.
"""

from __future__ import annotations

import argparse
import importlib
import json
import statistics
import time
from typing import Any

import trio
from mqtt_wire import Wire

from migratory.config import Config
from migratory.entitlement import entitlement_from_config
from migratory.model.message import Message
from migratory.protocol import mqtt
from migratory.protocol.mqtt_encode import encode_packet
from migratory.server.app import build_hub
from migratory.server.context import LocalPublishing, PublishReply, ServerContext, ServerStatistics
from migratory.server.mqtt_session import MqttSession

SESSION_PREFIX = "/$mqtt-session/"


class CountingPublishing(LocalPublishing):
    """The single server's publish path, counting what the session saves publish."""

    def __init__(self, hub: Any) -> None:
        super().__init__(hub)
        self.records = self.fields = self.bytes = 0

    def submit(self, message: Message, reply: PublishReply | None, now: float) -> None:
        if message.subject.startswith(SESSION_PREFIX):
            self.records += 1
            self.fields += len(message.fields)
            self.bytes += len(message.content) + sum(
                len(k) + len(v) for k, v in message.fields.items()
            )
        super().submit(message, reply, now)


class FakeClock:
    now = 1000.0

    def __call__(self) -> float:
        return self.now


def build(sessions: int, positions: int) -> tuple[Any, CountingPublishing, list[MqttSession]]:
    config = Config.from_mapping({"MaxSubscriptionsPerConnection": "10"})
    hub = build_hub(config)
    publishing = CountingPublishing(hub)
    ctx = ServerContext(config, hub, entitlement_from_config(config), ServerStatistics(),
                        publishing)
    for i in range(sessions):
        for k in range(positions):
            hub.publish(Message(f"/s{i}/{k}", b"x"), 0.0)
    registry: dict[str, MqttSession] = {}
    made = []
    for i in range(sessions):
        s = MqttSession(ctx, Wire(), "127.0.0.1:1", registry)  # type: ignore[arg-type]
        s.receive_data(encode_packet(mqtt.Connect(f"c{i}", clean_session=False)), 0.0)
        s.receive_data(encode_packet(mqtt.Subscribe(1, ((f"s{i}/#", 0),))), 0.0)
        while s.subscriptions.busy:
            s.subscriptions.work(1 << 30)
        made.append(s)
    for s in made:
        s.outbox.take()
    return hub, publishing, made


async def measure(args: argparse.Namespace) -> dict[str, Any]:
    clock = FakeClock()
    for name in ("mqtt_session", "mqtt_saving"):  # the clock of SAVE_INTERVAL, where it is
        try:
            module = importlib.import_module(f"migratory.server.{name}")
        except ImportError:
            continue
        if hasattr(module, "clock"):
            module.clock = clock
    built = time.perf_counter()
    hub, publishing, sessions = build(args.sessions, args.positions)
    built = time.perf_counter() - built
    stored = sum(len(s._record.positions) for s in sessions if s._record is not None)
    gaps: list[float] = []
    cycle_gap = [0.0]
    stop = trio.Event()

    async def ticker() -> None:
        last = time.perf_counter()
        while not stop.is_set():
            await trio.sleep(0.001)
            now = time.perf_counter()
            cycle_gap[0] = max(cycle_gap[0], now - last)
            last = now

    cpu: list[float] = []
    records: list[int] = []
    written: list[int] = []
    fields: list[int] = []
    async with trio.open_nursery() as nursery:
        nursery.start_soon(ticker)
        await trio.sleep(0.05)
        for cycle in range(args.cycles):
            clock.now += 1.0  # a second later: every record may be saved again
            cycle_gap[0] = 0.0
            before = (publishing.records, publishing.bytes, publishing.fields)
            started = time.thread_time()
            for i in range(len(sessions)):
                hub.publish(Message(f"/s{i}/{cycle % args.positions}", b"y"), 0.0)
            cpu.append(time.thread_time() - started)
            for s in sessions:
                s.outbox.take()
            await trio.sleep(0.05)  # the ticker's turn: the gap of this cycle is known
            gaps.append(cycle_gap[0])
            records.append(publishing.records - before[0])
            written.append(publishing.bytes - before[1])
            fields.append(publishing.fields - before[2])
        stop.set()
    return {
        "sessions": args.sessions,
        "positions_per_session": args.positions,
        "positions_stored": stored,
        "setup_s": round(built, 1),
        "cycles": args.cycles,
        "cpu_ms_per_cycle_median": round(statistics.median(cpu) * 1000, 2),
        "cpu_ms_per_cycle_max": round(max(cpu) * 1000, 2),
        "loop_gap_ms_median": round(statistics.median(gaps) * 1000, 2),
        "loop_gap_ms_max": round(max(gaps) * 1000, 2),
        "records_saved_per_cycle": statistics.median(records),
        "fields_saved_per_cycle": statistics.median(fields),
        "bytes_saved_per_cycle": statistics.median(written),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sessions", type=int, default=50)
    parser.add_argument("--positions", type=int, default=10_000)
    parser.add_argument("--cycles", type=int, default=10)
    print(json.dumps(trio.run(measure, parser.parse_args()), indent=2))


if __name__ == "__main__":
    main()
