"""Standard mode with real member processes and a persistent MQTT session that is away
(clean session 0, its client disconnected) while a peer dies with a forward unsent and
comes back: the session holds nothing in its member's hub while it is away, yet its
record names the filter. The peer's new life numbers the subject from seq 1 again; taken
as the subject's first (nobody held it), the session came back to that message alone --
the one lost with the peer missing, nothing told. It must get the resync instead (docs/
mqtt.md: an empty RETAIN when the subject has no snapshot), or the lost message."""

from __future__ import annotations

import sys
import time
from pathlib import Path

from test_cluster_mqtt_resume import mqtt_port
from test_cluster_standard import _forwarding, gated_pair
from test_cluster_standard_failover import stats
from test_cluster_standard_wildcard import SUBJECT, lost_with_a_restart, publish, received_until

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "server"))
from paho_client import PahoClient
from rawclient import RawClient

OTHER = "/Stocks/NYSE/T"


FILTERS = {"exact": "Stocks/NYSE/IBM", "wildcard": "Stocks/#"}


def test_a_forward_lost_while_a_persistent_session_is_away_is_its_resync(
    tmp_path: Path,
) -> None:
    """Two sessions on B subscribe (an exact filter; a wildcard) and disconnect; B holds
    nothing of SUBJECT then. A's link to B is cut, A acknowledges m1 (its forward waits),
    A is SIGKILLed and restarted, and publishes m2 (a new epoch, seq 1). Each session
    comes back on B: before, each got m2 alone, mqtt_resyncs 0 -- m1 lost unseen."""
    cluster, gate, _ = gated_pair(tmp_path, mqtt=True)
    try:
        cluster.wait_ready()
        _forwarding(cluster, [0, 1])
        for name, topic_filter in FILTERS.items():
            device = PahoClient(mqtt_port(cluster, 1), name, clean_session=False)
            assert device.subscribe(topic_filter, 1) == [1]
            device.stop()  # away: its record names the filter, B's hub holds none of it
        publisher = RawClient(cluster.port(0))
        publisher.connect("pub")
        publish(publisher, OTHER, b"other")  # B met A's first life and heard from it
        publisher = lost_with_a_restart(cluster, gate, publisher)  # m1 lost with A
        publish(publisher, SUBJECT, b"m2")
        deadline = time.monotonic() + 10
        while cluster.status(1)["forward_gaps"] < 1 and time.monotonic() < deadline:  # (m2 came)
            time.sleep(0.05)
        for name in FILTERS:
            back = PahoClient(mqtt_port(cluster, 1), name, clean_session=False)
            assert back.session_present
            got = [m for m in received_until(back, b"m2", wait=2) if m.topic == SUBJECT[1:]]
            assert b"m1" in [m.payload for m in got] or (got and got[0].retain), (
                f"{name}: m1 missed silently: got {got}")
            back.stop()
        assert stats(cluster, 1)["mqtt_resyncs"] >= len(FILTERS)
    finally:
        cluster.stop()
        gate.shutdown()
