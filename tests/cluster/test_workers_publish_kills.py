"""Workers = N: a worker SIGKILLed while publishes with an outcome to wait for are in
flight through it, from the Python SDK (many concurrent ``publish`` calls) and from an
MQTT QoS 1 publisher (PUBACKs), with real processes on 127.0.0.1 (docs/workers.md).
Every publish gets exactly one outcome; none acknowledged is lost; none said not sent
is published; none is published twice."""

from __future__ import annotations

import json
import os
import signal
import sys
import urllib.request
from collections import Counter
from pathlib import Path

import trio
from test_workers import SUBJECT, WorkersServer, clients_on_every_worker
from workers_reading import updates_until

from migratory_client import (
    Client,
    NotConnectedError,
    PublishOutcomeUnknown,
    PublishResult,
    ReconnectPolicy,
)
from migratory_client import connect as sdk_connect

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "server"))
from mqttclient import MqttRawClient

from migratory.model.topic import subject_to_topic
from migratory.protocol import mqtt, ops

TASKS = 40
EACH = 6
KILL_AFTER = 60
"""Outcomes the SDK's publishes have had when their worker is killed (the rest in flight)."""


def connections_open(url: str) -> int:
    return int(json.loads(urllib.request.urlopen(f"{url}/stats", timeout=5).read())
               ["connections_open"])


def test_sdk_publishes_in_flight_through_a_killed_worker_have_one_outcome_each(
    tmp_path: Path,
) -> None:
    server = WorkersServer(tmp_path, MonitorListen="127.0.0.1:0")
    try:
        on = clients_on_every_worker(server.port, workers=2, per_worker=1)
        subscribers = [on[name][0] for name in sorted(on)]
        for subscriber in subscribers:
            subscriber.subscribe(SUBJECT)
            subscriber.recv_ops_until_status(ops.Status.SUBSCRIBE_ALLOW, timeout=10)
        outcomes: dict[str, list[PublishResult | PublishOutcomeUnknown | NotConnectedError]] = {}
        fast = ReconnectPolicy(initial_delay=0.05, max_delay=0.2, connect_timeout=3.0)
        killed: list[int] = []

        async def publisher(client: Client, task: int, done: trio.Event) -> None:
            for i in range(EACH):
                content = f"t{task:02d}-{i}"
                result: PublishResult | PublishOutcomeUnknown | NotConnectedError
                try:
                    result = await client.publish(SUBJECT, content, timeout=15)
                except (PublishOutcomeUnknown, NotConnectedError) as exc:
                    result = exc
                outcomes.setdefault(content, []).append(result)
                if sum(map(len, outcomes.values())) >= KILL_AFTER and not done.is_set():
                    done.set()

        async def main() -> None:
            async with sdk_connect([f"ws://127.0.0.1:{server.port}"], reconnect=fast) as client:
                await client.wait_connected()
                opened = [connections_open(url) for url in server.monitoring]
                victim = opened.index(2)  # its subscriber and the SDK
                enough = trio.Event()
                with trio.fail_after(60):
                    async with trio.open_nursery() as nursery:
                        for task in range(TASKS):
                            nursery.start_soon(publisher, client, task, enough)
                        await enough.wait()
                        os.kill(server.pids[victim], signal.SIGKILL)
                        killed.append(victim)

        trio.run(main)
        assert len(outcomes) == TASKS * EACH
        assert all(len(o) == 1 for o in outcomes.values()), "a publish with two outcomes"
        kinds = Counter(type(o[0]).__name__ for o in outcomes.values())
        print(f"killed worker {killed}; outcomes {dict(kinds)}")
        results = {c.encode(): o[0] for c, o in outcomes.items() if isinstance(o[0], PublishResult)}
        assert all(r.ok for r in results.values()), [r for r in results.values() if not r.ok]
        ok = {content: result.position for content, result in results.items()}
        not_sent = {c.encode() for c, o in outcomes.items() if isinstance(o[0], NotConnectedError)}
        survivor = subscribers[1 - killed[0]]
        got = updates_until(survivor, ok, "the surviving worker's subscriber")
        assert {m.content: m.position for m in got if m.content in ok} == ok
        seqs = [m.seq for m in got]
        assert seqs == list(range(seqs[0], seqs[0] + len(seqs))), "gap or duplicate"
        contents = [m.content for m in got]
        assert len(contents) == len(set(contents)), "a publish was published twice"
        assert not not_sent & set(contents), "said not sent, but published"
    finally:
        server.stop()
        print(server.log()[-4000:])


def test_mqtt_qos1_publishes_in_flight_through_a_killed_worker(tmp_path: Path) -> None:
    server = WorkersServer(tmp_path, MonitorListen="127.0.0.1:0", ListenMqtt="127.0.0.1:0")
    try:
        mqtt_url = next(u for u in server.listening if u.startswith("mqtt:"))
        mqtt_port = int(mqtt_url.rsplit(":", 1)[1])
        on = clients_on_every_worker(server.port, workers=2, per_worker=1)
        subscribers = [on[name][0] for name in sorted(on)]
        for subscriber in subscribers:
            subscriber.subscribe(SUBJECT)
            subscriber.recv_ops_until_status(ops.Status.SUBSCRIBE_ALLOW, timeout=10)
        device = MqttRawClient(mqtt_port, timeout=10)
        assert device.connect("sensor", clean_session=True).return_code == 0
        opened = [connections_open(url) for url in server.monitoring]
        victim = opened.index(2)
        topic = subject_to_topic(SUBJECT)
        sent = 200
        for packet_id in range(1, sent + 1):  # all at once: most in flight
            device.send(mqtt.Publish(topic, f"p{packet_id:03d}".encode(), qos=1,
                                     packet_id=packet_id))
        pubacks: list[int] = []
        while len(pubacks) < 30:
            packet = device.recv()
            if isinstance(packet, mqtt.Puback):
                pubacks.append(packet.packet_id)
        os.kill(server.pids[victim], signal.SIGKILL)
        try:
            while len(pubacks) < sent:
                packet = device.recv()
                if isinstance(packet, mqtt.Puback):
                    pubacks.append(packet.packet_id)
        except (OSError, TimeoutError):  # its worker is gone
            pass
        device.close()
        print(f"{len(pubacks)} of {sent} acknowledged before the kill cut the rest off")
        assert len(pubacks) == len(set(pubacks)), "a PUBACK twice"
        assert pubacks == sorted(pubacks)
        acked = {f"p{i:03d}".encode() for i in pubacks}
        got = updates_until(subscribers[1 - victim], acked, "the surviving worker's subscriber")
        contents = [m.content for m in got]
        assert len(contents) == len(set(contents))
        assert contents == sorted(contents), "one connection's publishes out of order"
        seqs = [m.seq for m in got]
        assert seqs == list(range(seqs[0], seqs[0] + len(seqs))), "gap or duplicate"
    finally:
        server.stop()
        print(server.log()[-4000:])
