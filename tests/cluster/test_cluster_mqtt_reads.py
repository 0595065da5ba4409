"""A Guaranteed cluster (3 seeds, real processes, 127.0.0.1): an MQTT CONNECT on one
member reads the client's persistent session as committed when it came, though the
session was saved through another member a moment before (a read barrier at CONNECT,
docs/mqtt.md, read barrier); and while the Raft leader is
killed, a CONNECT is answered -- its session, or CONNACK 3 -- never held for ever and
never with the session lost. Counted, not timed."""

from __future__ import annotations

import sys
import threading
from pathlib import Path

from cluster_fixture import LocalCluster
from test_cluster_mqtt_resume import mqtt_port, with_mqtt

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "server"))
from mqttclient import MqttRawClient

from migratory.protocol import mqtt

TRIES = 30
TOPIC = "Scores/NBA/+"


def started(tmp_path: Path) -> LocalCluster:
    cluster = LocalCluster(tmp_path, members=3, seeds=3)
    with_mqtt(cluster)
    cluster.start_all()
    cluster.wait_ready()
    return cluster


def subscribed(port: int, client_id: str) -> MqttRawClient:
    client = MqttRawClient(port, timeout=10)
    connack = client.connect(client_id, clean_session=False)
    assert connack.return_code == 0, connack
    assert client.subscribe(TOPIC, qos=1).return_codes == (1,)
    return client


def test_a_clean_connect_on_another_member_right_after_a_suback_discards_the_session(
    tmp_path: Path,
) -> None:
    """SUBSCRIBE with clean session 0 on one member, at once clean session 1 on another,
    then clean session 0 on the first: no session may be present (14 of 30 found it
    before)."""
    cluster = started(tmp_path)
    try:
        present = []
        for attempt in range(TRIES):
            first, second = attempt % 3, (attempt + 1) % 3
            client_id = f"clean-{attempt}"
            other = MqttRawClient(mqtt_port(cluster, second), timeout=10)
            device = subscribed(mqtt_port(cluster, first), client_id)
            assert other.connect(client_id, clean_session=True).return_code == 0
            device.close()
            other.close()
            back = MqttRawClient(mqtt_port(cluster, first), timeout=10)
            if back.connect(client_id, clean_session=False).session_present:
                present.append(client_id)
            back.close()
        assert present == [], f"{len(present)} of {TRIES} found a discarded session"
    finally:
        cluster.stop()


def test_connects_while_the_leader_is_killed_are_answered_and_find_their_session(
    tmp_path: Path,
) -> None:
    """Devices subscribed on one member reconnect on another as the Raft leader is
    SIGKILLed: each CONNECT is answered within the client's 10 s (READ_BARRIER_WAIT is
    2 s): its session present, or CONNACK 3 and the device tries again (bounded); no
    device is ever told its session is gone."""
    cluster = started(tmp_path)
    try:
        leader = cluster.leader()
        first, second = [i for i in range(3) if i != leader]
        devices = [f"dev-{i}" for i in range(20)]
        for client_id in devices:
            subscribed(mqtt_port(cluster, first), client_id).close()
        killer = threading.Thread(target=cluster.kill, args=(leader,))
        killer.start()
        refused = 0
        lost = []
        for client_id in devices:
            for _ in range(10):
                client = MqttRawClient(mqtt_port(cluster, second), timeout=10)
                try:
                    connack = client.connect(client_id, clean_session=False)
                except ConnectionError:  # (closed: not ready while it elects)
                    refused += 1
                    client.close()
                    continue
                client.close()
                if connack.return_code == mqtt.REFUSED_SERVER_UNAVAILABLE:
                    refused += 1
                    continue
                assert connack.return_code == 0, connack
                if not connack.session_present:
                    lost.append(client_id)
                break
            else:
                raise AssertionError(f"{client_id}: refused 10 times ({refused} refusals)")
        killer.join(15)
        assert lost == [], f"{len(lost)} of {len(devices)} sessions lost across the kill"
    finally:
        cluster.stop()
