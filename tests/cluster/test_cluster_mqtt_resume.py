"""MQTT in a real Guaranteed cluster: a persistent session (clean session = 0) whose
member is SIGKILLed resumes on another member from its position -- every
acknowledged message arrives, in order, none lost (QoS 1: at least once); and a
QoS 1 PUBACK comes only once the seed majority holds the message."""

from __future__ import annotations

import queue
import sys
import time
from pathlib import Path

from cluster_fixture import LocalCluster
from test_cluster_processes import SUBJECT, Background, Publisher

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "server"))
from mqttclient import MqttRawClient
from paho_client import PahoClient

from migratory.model.topic import subject_to_topic

TOPIC = subject_to_topic(SUBJECT)  # Scores/NBA/LAL


def with_mqtt(cluster: LocalCluster) -> None:
    for i, settings in enumerate(cluster.settings):
        settings["ListenMqtt"] = f"127.0.0.1:{cluster.port(i) + 5}"


def mqtt_port(cluster: LocalCluster, index: int) -> int:
    return cluster.port(index) + 5


def test_persistent_session_resumes_on_another_member_after_a_kill(tmp_path: Path) -> None:
    cluster = LocalCluster(tmp_path, members=3, seeds=3)
    with_mqtt(cluster)
    cluster.start_all()
    try:
        cluster.wait_ready()
        device = PahoClient(mqtt_port(cluster, 1), "scoreboard", clean_session=False)
        assert not device.session_present
        # the SUBACK of a persistent session comes once its record is acknowledged
        assert device.subscribe("Scores/NBA/+", 1) == [1]
        publisher = Publisher(cluster, 2, count=150, pause=0.01)
        publisher.start()
        payloads: list[bytes] = [m.payload for m in device.receive(40, timeout=30)]
        killer = Background(cluster.kill, 1)
        killer.start()
        while not device.disconnected.is_set():  # what was on the way before the kill
            try:
                payloads += [m.payload for m in device.receive(1, timeout=0.5)]
            except queue.Empty:
                break
        killer.finish(15)
        device.client.loop_stop()
        resumed = PahoClient(mqtt_port(cluster, 0), "scoreboard", clean_session=False)
        assert resumed.session_present, "the session did not survive its member"
        publisher.finish(60)
        acked = [content for content, _ in publisher.acked]
        deadline = time.monotonic() + 30
        while not set(acked) <= set(payloads) and time.monotonic() < deadline:
            try:
                payloads += [m.payload for m in resumed.receive(1, timeout=1)]
            except queue.Empty:
                continue
        missing = [c for c in acked if c not in payloads]
        assert not missing, f"acknowledged messages lost: {missing[:5]} ({len(missing)})"
        # in order, duplicates (QoS 1 redelivery after the failover) allowed
        firsts = list(dict.fromkeys(payloads))
        assert firsts == sorted(firsts), "delivered out of order"
        duplicates = len(payloads) - len(firsts)
        print(f"received {len(payloads)}, acknowledged {len(acked)}, failed "
              f"{len(publisher.failed)}, redelivered {duplicates}")
        assert len(publisher.failed) <= 2
        resumed.stop()
    finally:
        cluster.stop()


def test_qos1_puback_waits_for_the_seed_majority(tmp_path: Path) -> None:
    cluster = LocalCluster(tmp_path, members=3, seeds=3)
    with_mqtt(cluster)
    cluster.start_all()
    try:
        cluster.wait_ready()
        client = PahoClient(mqtt_port(cluster, 0), "majority")
        client.publish(TOPIC, b"with a majority", qos=1)  # PUBACK within the timeout
        for member in (0, 1):  # subjects of many groups: PUBACKs in the PUBLISHes' order
            burst = MqttRawClient(mqtt_port(cluster, member), timeout=30)
            burst.connect(f"burst-{member}")
            acked = burst.publish_burst(2000, subjects=200)
            assert acked == [n % 65535 + 1 for n in range(2000)], "PUBACKs out of order"
            burst.close()
        cluster.kill(1)
        cluster.kill(2)  # no majority of seeds any more
        info = client.client.publish(TOPIC, b"without a majority", qos=1)
        info.wait_for_publish(3)
        assert not info.is_published(), "PUBACK without a seed majority"
    finally:
        cluster.stop()
