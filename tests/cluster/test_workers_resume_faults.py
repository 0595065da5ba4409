"""Workers = N: a worker SIGKILLed while an MQTT persistent session (clean session 0, QoS
1) and an SSE stream with ``Last-Event-ID`` are both in the middle of resuming on it,
with real processes on 127.0.0.1 (docs/workers.md). Each has read part of what it
missed when its worker dies; each resumes again through the shared port, on whichever
worker the kernel picks (the other, or the killed one restarted)."""

from __future__ import annotations

import json
import os
import signal
import sys
import time
import urllib.request
from pathlib import Path
from typing import Any

from test_workers import SUBJECT, WorkersServer, clients_on_every_worker
from workers_mqtt import Device

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "server"))
from httpclient import SseClient

from migratory.model.message import Message, Qos
from migratory.model.topic import subject_to_topic
from migratory.protocol import ops

TOPIC = subject_to_topic(SUBJECT)
DEVICE = "meter-7"
MISSED = 120
"""Messages published while both are away: the resume they are killed in the middle of."""
READ_BEFORE_KILL = 15


def connections_open(url: str) -> int:
    answer: dict[str, Any] = json.loads(urllib.request.urlopen(f"{url}/stats", timeout=5).read())
    return int(answer["connections_open"])


def resumed_stream(port: int, last_id: str | None) -> tuple[SseClient, list[dict[str, Any]]]:
    """The stream again from ``last_id`` through the port (tried again while it lands on
    a worker that refuses it or dies under it): the stream and its events up to ``sync``."""
    for _ in range(200):
        stream = SseClient(port, [SUBJECT], last_event_id=last_id)
        try:
            if stream.wait_head(10) == 200:
                return stream, stream.events_until("sync", timeout=10)
        except (OSError, AssertionError):
            pass
        stream.close()
        time.sleep(0.05)
    raise AssertionError("no worker resumed the stream")


def test_an_mqtt_session_and_an_sse_stream_killed_mid_resume_resume_again(
    tmp_path: Path,
) -> None:
    server = WorkersServer(tmp_path, MonitorListen="127.0.0.1:0", ListenMqtt="127.0.0.1:0")
    try:
        mqtt_url = next(u for u in server.listening if u.startswith("mqtt:"))
        mqtt_port = int(mqtt_url.rsplit(":", 1)[1])
        victim = 1
        on = clients_on_every_worker(server.port, workers=2, per_worker=1)
        publisher = on["migratory-worker-0"][0]
        on[f"migratory-worker-{victim}"][0].close()  # the victim serves only the two
        acked: list[tuple[bytes, Any]] = []

        def publish(count: int) -> None:
            for _ in range(count):
                content = f"m{len(acked):04d}".encode()
                status = publisher.publish(Message(SUBJECT, content, closure=content.decode(),
                                                   qos=Qos.GUARANTEED))
                assert status.status is ops.Status.PUBLISH_OK, status
                acked.append((content, status.position))

        device = Device(mqtt_port, DEVICE)
        assert device.connect() is False  # a new session
        assert device.client is not None
        device.client.subscribe(TOPIC, qos=1)
        stream = SseClient(server.port, [SUBJECT])
        stream.events_until("subscribe")
        events = []
        publish(20)
        device.receive_until([c for c, _ in acked], stage="before the resumes")
        while len(events) < 20:
            event = stream.next_event(10)
            assert event is not None
            if event["event"] == "message" and event["data"]["type"] == "update":
                events.append(event)
        last_id = stream.last_id
        device.client.close()  # (the connection's end saves the session's positions)
        stream.close()
        publish(MISSED)  # while both are away

        # both resume on the victim and read part of what they missed
        monitor = server.monitoring[victim]
        for _ in range(200):
            stream = SseClient(server.port, [SUBJECT], last_event_id=last_id)
            assert stream.wait_head(10) == 200
            if connections_open(monitor) == 1:
                break
            stream.close()
        else:
            raise AssertionError("the stream never landed on the victim")
        for _ in range(200):
            assert device.connect() is True, "the session was lost before any kill"
            if connections_open(monitor) == 2:
                break
            assert device.client is not None
            device.client.close()
        else:
            raise AssertionError("the device never landed on the victim")
        partial = []
        while len(partial) < READ_BEFORE_KILL:
            event = stream.next_event(10)
            assert event is not None
            if event["event"] == "message":
                partial.append(event)
        device.receive(READ_BEFORE_KILL, stage="part of the first resume")
        last_id = stream.last_id
        os.kill(server.pids[victim], signal.SIGKILL)  # both mid-resume
        stream.close()
        device.client.close()  # type: ignore[union-attr]
        publish(10)  # while both are away again

        stream, resumed = resumed_stream(server.port, last_id)
        for _ in range(200):
            present = device.connect()
            if present is not None:
                assert present, "the session did not survive its worker's kill"
                break
            time.sleep(0.05)
        else:
            raise AssertionError("no worker took the session back")
        publish(5)
        contents = [c for c, _ in acked]
        device.receive_until(contents, stage="the resume after the kill")
        print(f"device: {len(device.payloads)} deliveries of {len(contents)} messages; "
              f"stream resumed with {len(resumed)} events")
        firsts = list(dict.fromkeys(device.payloads))  # QoS 1: a redelivery is allowed
        assert firsts == contents, "the session lost or reordered across the kill"
        got = events + partial + [e for e in resumed if e["event"] == "message"]
        while len(got) < len(acked):
            event = stream.next_event(10)
            assert event is not None, f"the stream stopped after {len(got)} of {len(acked)}"
            if event["event"] == "message":
                got.append(event)
        statuses = [e["event"] for e in resumed if e["event"] != "message"]
        assert "resync" not in statuses, statuses
        assert [e["data"]["content"] for e in got] == [c.decode() for c in contents], (
            "the stream has a gap or a duplicate across the kill")
        assert [(e["data"]["epoch"], e["data"]["seq"]) for e in got] == [
            (p.epoch, p.seq) for _, p in acked]
        stream.close()
        device.client.close()  # type: ignore[union-attr]
    finally:
        server.stop()
        print(server.log()[-4000:])
