"""A persistent MQTT session at the filter limits, real processes (a Guaranteed
cluster): one SUBSCRIBE of MaxSubjectsPerSubscribe (1,000) filters, 100 of them wildcards
(MAX_WILDCARD_FILTERS) over 2,000 retained subjects, 900 exact ones of 200-byte levels
(a record of ~200 kB); a 101st wildcard refused with 0x80; its member SIGKILLed, the
session resumed on another member with every filter, nothing replayed that it had
acknowledged. Nothing broke when this was written: the check of the combination."""

from __future__ import annotations

import sys
import time
from pathlib import Path

from test_cluster_mqtt_connect_race import Publisher, mqtt_cluster, received
from test_cluster_mqtt_resume import mqtt_port

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "server"))
from mqttclient import MqttRawClient

from migratory.protocol import mqtt
from migratory.protocol.mqtt_encode import encode_packet

RETAINED = 2000
LONG = "y" * 200


def test_a_session_of_a_thousand_filters_resumes_whole_after_its_member_is_killed(
    tmp_path: Path,
) -> None:
    with mqtt_cluster(tmp_path) as cluster:
        leader = cluster.leader()
        on, elsewhere = [i for i in range(3) if i != leader]
        publisher = Publisher(mqtt_port(cluster, leader))
        raw = publisher.client
        raw.send_raw(b"".join(
            encode_packet(mqtt.Publish(f"w{i % 100}/s/{i}", b"r%d" % i, qos=1, retain=True,
                                       packet_id=i + 1))
            for i in range(RETAINED)))
        publisher.packet_id = RETAINED
        acks = 0
        while acks < RETAINED:
            acks += isinstance(raw.recv(), mqtt.Puback)
        device = MqttRawClient(mqtt_port(cluster, on), timeout=30)
        assert device.connect("limits", clean_session=False).return_code == 0
        filters = ([(f"w{k}/+/#", 1) for k in range(100)]
                   + [(f"x/{i}/{LONG}", 1) for i in range(900)])
        device.send(mqtt.Subscribe(1, tuple(filters)))
        retained = 0
        while not isinstance(packet := device.recv(), mqtt.Suback):
            if isinstance(packet, mqtt.Publish):
                retained += 1
                device.send(mqtt.Puback(packet.packet_id))  # type: ignore[arg-type]
        assert packet.return_codes == (1,) * 1000 and retained == RETAINED
        more = MqttRawClient(mqtt_port(cluster, on), timeout=10)
        assert more.connect("more").return_code == 0
        codes = more.subscribe(*(f"z{k}/#" for k in range(101))).return_codes
        assert codes == (0,) * 100 + (0x80,)
        time.sleep(2.5)  # its PUBACKed positions saved (SAVE_INTERVAL)
        cluster.kill(on)
        back = MqttRawClient(mqtt_port(cluster, elsewhere), timeout=30)
        assert back.connect("limits", clean_session=False).session_present
        publisher.publish(f"x/899/{LONG}", b"late-exact")
        publisher.publish("w99/s/99999", b"late-wild")
        assert [p.payload for p in received(back, 3.0)] == [b"late-exact", b"late-wild"]
        for i in range(3):
            assert "Traceback" not in cluster.log(i)
