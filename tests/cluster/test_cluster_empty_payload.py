"""A Guaranteed cluster (3 seeds, real processes) takes a message with empty content:
MQTT's empty payload (a QoS 1 publish, a retained message cleared). Raft pickles a
batch with protocol 2, where empty bytes are ``builtins.bytes()``: the Raft unpickler
refused that global (cluster/raft_unpickler.py), every Raft tick failed, and nothing
was committed after it."""

from __future__ import annotations

import sys
from pathlib import Path

from cluster_fixture import LocalCluster
from test_cluster_mqtt_resume import mqtt_port, with_mqtt

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "server"))
from mqttclient import MqttRawClient

from migratory.protocol import mqtt


def test_an_empty_payload_is_committed_and_so_is_what_follows(tmp_path: Path) -> None:
    cluster = LocalCluster(tmp_path, members=3, seeds=3)
    with_mqtt(cluster)
    cluster.start_all()
    try:
        cluster.wait_ready()
        publisher = MqttRawClient(mqtt_port(cluster, 1), timeout=10)
        assert publisher.connect("publisher").return_code == 0
        for packet_id, payload in ((1, b""), (2, b"after")):
            publisher.send(mqtt.Publish("a/b", payload, qos=1, packet_id=packet_id))
            assert publisher.recv() == mqtt.Puback(packet_id), payload
        publisher.close()
    finally:
        cluster.stop()
