"""Workers = N and the other transports' resumes, with real processes on 127.0.0.1: an
MQTT persistent session whose worker is SIGKILLed resumes through the shared port on
another worker process (the other one, or the killed one restarted: either knows the
session only because its record is a retained message numbered by the sequencer);
see docs/workers.md. (SSE with Last-Event-ID across a worker's kill, and both resumes
killed again half-way: test_workers_resume_faults.py.)"""

from __future__ import annotations

import os
import queue
import signal
import sys
import time
from pathlib import Path

from test_workers import WorkersServer
from workers_mqtt import (
    SILENCE,
    TOPIC,
    Publisher,
    firsts,
    missing_text,
    mqtt_port,
    worker_holding,
)

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "server"))
from paho_client import PahoClient


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


def receive_until(client: PahoClient, payloads: list[bytes], wanted: list[bytes],
                  stage: str) -> None:
    """Into ``payloads`` until it holds every one of ``wanted``; a silence of SILENCE
    seconds fails, saying at which stage and which messages are missing."""
    while not set(wanted) <= set(payloads):
        try:
            received = client.messages.get(timeout=SILENCE)
        except queue.Empty:
            raise AssertionError(f"{stage}: nothing for {SILENCE} s, "
                                 f"{missing_text(wanted, payloads)}") from None
        assert received.qos == 1, received
        payloads.append(received.payload)


def test_an_mqtt_persistent_session_resumes_on_another_worker_after_a_kill(
    tmp_path: Path,
) -> None:
    """Guaranteed messages, so QoS 1 deliveries: a position is saved once PUBACKed."""
    server = WorkersServer(tmp_path, ListenMqtt="127.0.0.1:0")
    try:
        port = mqtt_port(server)
        device = PahoClient(port, "scoreboard", clean_session=False)
        assert not device.session_present
        assert device.subscribe(TOPIC, 1) == [1]  # once the session's record is numbered
        victim = worker_holding(server, device.client.socket())
        publisher = Publisher(server.port, avoid=victim)
        payloads: list[bytes] = []
        receive_until(device, payloads, publisher.publish(20), "before the kill")
        os.kill(server.pids[victim], signal.SIGKILL)
        assert device.disconnected.wait(SILENCE), "the device outlived its worker's kill"
        device.client.loop_stop()
        publisher.publish(20)  # while the device is away
        resumed = reconnect(port, "scoreboard")
        assert resumed.session_present, "the session did not survive its worker"
        publisher.publish(5)
        receive_until(resumed, payloads, publisher.acked, "after the resume")
        # QoS 1: a redelivery after the kill is allowed
        assert firsts(payloads) == publisher.acked, "out of order across the worker's crash"
        assert not publisher.unknown  # (the publisher's worker was not killed)
        resumed.stop()
    finally:
        server.stop()
