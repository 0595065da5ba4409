"""A will when the member dies, not the client (real processes, a Guaranteed cluster):
the member that held the connection is gone, so nothing publishes the will then -- the
client is expected to reconnect elsewhere, its CONNECT bringing its will back -- nor
when that member starts again. The will of the client's next connection goes out once,
when that one ends without DISCONNECT (docs/mqtt.md, "Keep-alive, will, DISCONNECT")."""

from __future__ import annotations

import sys
from pathlib import Path

from test_cluster_mqtt_connect_race import mqtt_cluster, received
from test_cluster_mqtt_resume import mqtt_port

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "server"))
from mqttclient import MqttRawClient

from migratory.protocol import mqtt


def publishes(client: MqttRawClient, seconds: float) -> list[tuple[str, bytes]]:
    return [(p.topic, p.payload) for p in received(client, seconds)]


def test_a_member_killed_under_a_client_publishes_no_will_its_next_connection_one(
    tmp_path: Path,
) -> None:
    with mqtt_cluster(tmp_path) as cluster:
        watched, elsewhere = [i for i in range(3) if i != cluster.leader()]
        watcher = MqttRawClient(mqtt_port(cluster, cluster.leader()), timeout=10)
        assert watcher.connect("watcher").return_code == 0
        assert watcher.subscribe("dev/status", qos=1).return_codes == (1,)
        will = mqtt.Will("dev/status", b"gone", 1, False)
        device = MqttRawClient(mqtt_port(cluster, watched), timeout=10)
        assert device.connect("dev", clean_session=False, will=will).return_code == 0
        assert device.subscribe("cmd/dev", qos=1).return_codes == (1,)
        cluster.kill(watched)
        again = MqttRawClient(mqtt_port(cluster, elsewhere), timeout=10)
        assert again.connect("dev", clean_session=False, will=will).session_present
        cluster.start(watched)
        cluster.wait_ready([watched])
        assert publishes(watcher, 1.0) == []  # not at the kill, the reconnect, the restart
        again.close()  # without DISCONNECT
        assert publishes(watcher, 3.0) == [("dev/status", b"gone")]
        last = MqttRawClient(mqtt_port(cluster, watched), timeout=10)
        assert last.connect("dev", clean_session=False, will=will).session_present
        last.send(mqtt.Disconnect())
        assert publishes(watcher, 1.0) == []
        for i in range(3):
            assert "Traceback" not in cluster.log(i)
