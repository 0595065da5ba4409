"""Workers = N and the other transports' resumes, with real processes on 127.0.0.1: an
MQTT persistent session whose worker is SIGKILLed resumes through the shared port on
another worker process (the other one, or the killed one restarted: either knows the
session only because its record is a retained message numbered by the sequencer);
see docs/workers.md. (SSE with Last-Event-ID across a worker's kill, and both resumes
killed again half-way: test_workers_resume_faults.py.)"""

from __future__ import annotations

import json
import os
import queue
import signal
import sys
import time
import urllib.request
from pathlib import Path

from test_workers import SUBJECT, WorkersServer, clients_on_every_worker

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "server"))
from paho_client import PahoClient

from migratory.model.message import Message
from migratory.model.topic import subject_to_topic
from migratory.protocol import ops

TOPIC = subject_to_topic(SUBJECT)


def stats(url: str) -> dict[str, int]:
    answer: dict[str, int] = json.loads(urllib.request.urlopen(f"{url}/stats", timeout=5).read())
    return answer


def reconnect(port: int, client_id: str) -> PahoClient:
    """The session again through the shared port; a worker just restarted and not caught
    up yet refuses the CONNECT (or closes): try again, as a device would."""
    deadline = time.monotonic() + 15
    while True:
        try:
            client = PahoClient(port, client_id, clean_session=False, timeout=3)
        except (OSError, queue.Empty):
            client = None
        if client is not None and client.return_code == 0:
            return client
        if client is not None:
            client.client.loop_stop()
        assert time.monotonic() < deadline, "no worker took the session back"
        time.sleep(0.1)


def test_an_mqtt_persistent_session_resumes_on_another_worker_after_a_kill(
    tmp_path: Path,
) -> None:
    server = WorkersServer(tmp_path, MonitorListen="127.0.0.1:0", ListenMqtt="127.0.0.1:0")
    try:
        mqtt_url = next(url for url in server.listening if url.startswith("mqtt:"))
        mqtt_port = int(mqtt_url.rsplit(":", 1)[1])
        device = PahoClient(mqtt_port, "scoreboard", clean_session=False)
        assert not device.session_present
        assert device.subscribe(TOPIC, 1) == [1]  # once the session's record is numbered
        holds = [stats(url)["mqtt_sessions_opened"] for url in server.monitoring]
        victim = holds.index(1)
        on = clients_on_every_worker(server.port, workers=2, per_worker=1)
        publisher = on[f"migratory-worker-{1 - victim}"][0]
        acked: list[bytes] = []

        def publish(count: int) -> None:
            for _ in range(count):
                content = f"m{len(acked):03d}".encode()
                status = publisher.publish(Message(SUBJECT, content, closure=content.decode()))
                assert status.status is ops.Status.PUBLISH_OK, status
                acked.append(content)

        publish(20)
        payloads = [m.payload for m in device.receive(20)]
        os.kill(server.pids[victim], signal.SIGKILL)
        device.client.loop_stop()
        publish(20)  # while the device is away
        resumed = reconnect(mqtt_port, "scoreboard")
        assert resumed.session_present, "the session did not survive its worker"
        publish(5)
        while set(payloads) != set(acked):
            payloads.append(resumed.receive(1)[0].payload)
        firsts = list(dict.fromkeys(payloads))  # QoS 1: a redelivery after the kill is allowed
        assert firsts == acked, "lost or out of order across the worker's crash"
        resumed.stop()
    finally:
        server.stop()
