"""Standard mode with real member processes and an MQTT wildcard subscriber: a forward
lost with a killed member, of a subject the subscriber's member never held (only the
wildcard filter matches it), must be announced to that subscriber after the restart --
a counted resync (``mqtt_resyncs``: MQTT has no way to tell the client) -- not left as
a silent gap. (Native subscriptions have no wildcards: subjects are exact.)"""

from __future__ import annotations

import queue
import sys
import time
from pathlib import Path

from cluster_fixture import LocalCluster
from tcp_gate import TcpGate
from test_cluster_mqtt_resume import mqtt_port
from test_cluster_standard import _forwarding, gated_pair
from test_cluster_standard_failover import stats
from test_cluster_standard_restart import killed_and_back

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "server"))
from paho_client import PahoClient, Received
from rawclient import RawClient

from migratory.model.message import Message
from migratory.protocol import ops

SUBJECT, OTHER = "/Stocks/NYSE/IBM", "/Stocks/NYSE/T"


def publish(client: RawClient, subject: str, content: bytes) -> None:
    status = client.publish(Message(subject, content, closure=content.decode()))
    assert status.status is ops.Status.PUBLISH_OK


def received_until(device: PahoClient, last: bytes, wait: float = 10) -> list[Received]:
    """What ``device`` receives until ``last`` (or nothing for ``wait`` s)."""
    got: list[Received] = []
    for _ in range(100):
        try:
            (message,) = device.receive(1, timeout=wait)
        except queue.Empty:
            break
        got.append(message)
        if message.payload == last:
            break
    return got


def payloads_until(device: PahoClient, last: bytes) -> list[bytes]:
    """The payloads ``device`` receives until ``last`` (or nothing for 10 s)."""
    return [message.payload for message in received_until(device, last)]


def lost_with_a_restart(cluster: LocalCluster, gate: TcpGate, publisher: RawClient
                        ) -> RawClient:
    """A's link to B cut, SUBJECT's m1 acknowledged on A (its forward waiting in A's
    queue), A SIGKILLed and started again: a publisher on its new life."""
    gate.close_gate(reset_open=True)  # A's link to B reset, and refused from now on
    deadline = time.monotonic() + 10
    while cluster.status(0)["forwarding_to"] and time.monotonic() < deadline:
        time.sleep(0.05)
    assert cluster.status(0)["forwarding_to"] == []
    publish(publisher, SUBJECT, b"m1")  # acknowledged; its forward waits in A's queue
    return killed_and_back(cluster, [gate])


def test_a_lost_forward_of_a_subject_only_a_wildcard_matches_is_a_counted_resync(
    tmp_path: Path,
) -> None:
    """B's MQTT session subscribes ``Stocks/#``; B holds no SUBJECT (no exact subscriber,
    nothing of it published). A's link to B is cut, A acknowledges SUBJECT's first message
    (its forward waits in A's queue), A is SIGKILLed, restarted, and forwards SUBJECT's
    next message at (a new epoch, seq 1). Before: B took it as SUBJECT's first (a subject
    it did not hold, no one to miss anything): the session got m2 alone, no resync
    counted, nothing logged -- a silent gap. A subject the filter does not match is no
    resync."""
    cluster, gate, _ = gated_pair(tmp_path, mqtt=True)
    try:
        cluster.wait_ready()
        _forwarding(cluster, [0, 1])
        device = PahoClient(mqtt_port(cluster, 1), "watcher")
        assert device.subscribe("Stocks/#", 0) == [0]
        publisher = RawClient(cluster.port(0))
        publisher.connect("pub")
        publish(publisher, OTHER, b"other")  # B met A's first life, and heard from it
        assert payloads_until(device, b"other") == [b"other"]
        publisher = lost_with_a_restart(cluster, gate, publisher)
        publish(publisher, SUBJECT, b"m2")
        got = payloads_until(device, b"m2")
        assert got[-1] == b"m2", got
        resyncs = stats(cluster, 1)["mqtt_resyncs"]
        assert b"m1" in got or resyncs == 1, f"m1 missed silently: got {got}, " \
            f"mqtt_resyncs {resyncs}"
        assert cluster.status(1)["forward_gaps"] == 1
        publish(publisher, "/Bonds/US/T10", b"bond")  # no filter matches: nothing to tell
        publish(publisher, SUBJECT, b"m3")
        assert payloads_until(device, b"m3") == [b"m3"]
        assert stats(cluster, 1)["mqtt_resyncs"] == resyncs
        device.stop()
    finally:
        cluster.stop()
        gate.shutdown()
