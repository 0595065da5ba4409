"""One connection per MQTT client id in a Guaranteed cluster (MQTT 3.1.1 section 3.1.4:
a CONNECT of a client id already connected closes the existing connection), across
members: a CONNECT on one member closes the connection of its client id on another
(migratory/server/mqtt_takeover.py)."""

from __future__ import annotations

import sys
from pathlib import Path

from cluster_fixture import LocalCluster
from test_cluster_mqtt_resume import mqtt_port, with_mqtt

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "server"))
from mqttclient import MqttRawClient

from migratory.protocol import mqtt


def test_a_connect_on_another_member_closes_the_connection_of_its_client_id(
    tmp_path: Path,
) -> None:
    """Before, both connections stayed open (the first one until its keep-alive ran out),
    the persistent one delivering what its record no longer saved."""
    cluster = LocalCluster(tmp_path, members=3, seeds=3)
    with_mqtt(cluster)
    cluster.start_all()
    try:
        cluster.wait_ready()
        for clean in (False, True):
            client_id = f"device-{'clean' if clean else 'persistent'}"
            first = MqttRawClient(mqtt_port(cluster, 0), timeout=10)
            assert first.connect(client_id, clean_session=clean).return_code == 0
            assert first.subscribe("t/x", qos=1).return_codes == (1,)
            second = MqttRawClient(mqtt_port(cluster, 1), timeout=10)
            assert second.connect(client_id, clean_session=clean).session_present == (
                not clean)
            assert first.closed_by_server(10), f"{client_id}: the first connection stayed"
            third = MqttRawClient(mqtt_port(cluster, 2), timeout=10)
            assert third.connect(client_id, clean_session=clean).return_code == 0
            assert second.closed_by_server(10), f"{client_id}: the second connection stayed"
            # the last one stays: it answers a PINGREQ after the others were closed
            third.send(mqtt.Pingreq())
            assert isinstance(third.recv(), mqtt.Pingresp)
            third.close()
    finally:
        cluster.stop()
