"""Workers = 2: an MQTT CONNECT reads its client's persistent session as committed when
it came, whichever worker took the client before (real processes, 127.0.0.1;
docs/mqtt.md, read barrier). Each try puts a client on one
worker, then -- with no pause after the SUBACK -- on the other: the second worker must
see the first's save (a read barrier at CONNECT); before, it read its own view, not
yet caught up. Counted, not timed: every try must hold."""

from __future__ import annotations

import json
import os
import signal
import socket
import time
import urllib.request
from pathlib import Path

from test_workers import WorkersServer
from workers_mqtt import TOPIC, MqttRawClient, mqtt_port, worker_holding

from migratory.protocol import mqtt

TRIES = 40


def on_worker(server: WorkersServer, port: int, index: int) -> MqttRawClient:
    """A connection (no CONNECT yet) that the kernel gave to worker ``index``."""
    for _ in range(200):  # each lands on either worker: one in 2**200 never does
        client = MqttRawClient(port, timeout=10)
        if holder(server, client) == index:
            return client
        client.close()
    raise AssertionError(f"no connection reached worker {index}")


def holder(server: WorkersServer, client: MqttRawClient) -> int:
    """The worker holding ``client``'s connection once one has accepted it."""
    for _ in range(500):  # (a bound on a hang: accepted within milliseconds)
        try:
            return worker_holding(server, client.sock)
        except AssertionError:  # still in the listeners' queue
            time.sleep(0.002)
    return worker_holding(server, client.sock)


def subscribed_on(server: WorkersServer, port: int, client_id: str) -> MqttRawClient:
    """``client_id`` with a persistent session, subscribed (SUBACK in) on worker 0."""
    client = on_worker(server, port, 0)
    assert client.connect(client_id, clean_session=False).return_code == 0
    assert client.subscribe(TOPIC, qos=1).return_codes == (1,)
    return client


def test_a_clean_connect_on_another_worker_right_after_a_suback_discards_the_session(
    tmp_path: Path,
) -> None:
    """SUBSCRIBE with clean session 0 on worker 0, at once clean session 1 on worker 1,
    then clean session 0 on worker 0: no session may be present (the clean CONNECT
    discarded it). Before: worker 1 had not applied worker 0's save, found nothing to
    discard, and the third CONNECT found the old session (9 of 40 tries)."""
    server = WorkersServer(tmp_path, ListenMqtt="127.0.0.1:0")
    try:
        port = mqtt_port(server)
        present = []
        for attempt in range(TRIES):
            client_id = f"clean-{attempt}"
            second = on_worker(server, port, 1)  # ready before the SUBACK: no pause
            first = subscribed_on(server, port, client_id)
            connack = second.connect(client_id, clean_session=True)
            first.close()
            assert connack.return_code == 0
            second.close()
            third = on_worker(server, port, 0)
            if third.connect(client_id, clean_session=False).session_present:
                present.append(client_id)
            third.close()
        assert present == [], f"{len(present)} of {TRIES} found a discarded session"
    finally:
        server.stop()


def test_a_persistent_connect_on_another_worker_right_after_a_suback_resumes_it(
    tmp_path: Path,
) -> None:
    """SUBSCRIBE with clean session 0 on worker 0, at once clean session 0 on worker 1:
    the session is present with its filter, and a message published then reaches the
    client there. Before: worker 1 had not applied the save, started a fresh session
    (session present 0, no filter: the messages after it were never delivered; 5 of 40
    tries)."""
    server = WorkersServer(tmp_path, ListenMqtt="127.0.0.1:0")
    try:
        port = mqtt_port(server)
        absent = []
        for attempt in range(TRIES):
            client_id = f"persistent-{attempt}"
            second = on_worker(server, port, 1)
            first = subscribed_on(server, port, client_id)
            first.sock.shutdown(socket.SHUT_RDWR)
            connack = second.connect(client_id, clean_session=False)
            first.close()
            assert connack.return_code == 0
            if not connack.session_present:
                absent.append(client_id)
            second.close()
        assert absent == [], f"{len(absent)} of {TRIES} lost a session just subscribed"
        last = on_worker(server, port, 1)  # the filter holds: a publish comes
        assert last.connect(f"persistent-{TRIES - 1}", clean_session=False).session_present
        publisher = MqttRawClient(port)
        publisher.connect("publisher")
        publisher.send(mqtt.Publish(TOPIC, b"after", qos=1, packet_id=1))
        received = last.recv_publishes(1)
        assert received[0].payload == b"after"
        publisher.close()
        last.close()
    finally:
        server.stop()


def test_a_persistent_connect_on_another_worker_skips_nothing_after_a_resume(
    tmp_path: Path,
) -> None:
    """Messages delivered and PUBACKed on worker 0, the connection dropped, at once clean
    session 0 on worker 1, then more messages: every message comes at least once over
    the two connections (those already PUBACKed may come again: the position saved
    before the resume may be an older one; QoS 1), each in order after the resume."""
    server = WorkersServer(tmp_path, ListenMqtt="127.0.0.1:0")
    try:
        port = mqtt_port(server)
        publisher = MqttRawClient(port)
        assert publisher.connect("publisher").return_code == 0
        packet_id = 0

        def publish(payload: bytes) -> None:
            nonlocal packet_id
            packet_id += 1
            publisher.send(mqtt.Publish(TOPIC, payload, qos=1, packet_id=packet_id))
            assert publisher.recv() == mqtt.Puback(packet_id)

        for attempt in range(10):
            client_id = f"resumed-{attempt}"
            second = on_worker(server, port, 1)
            first = subscribed_on(server, port, client_id)
            sent = [f"{attempt}-{n}".encode() for n in range(10)]
            for payload in sent[:5]:
                publish(payload)
            came = []
            for publish_packet in first.recv_publishes(5):
                came.append(publish_packet.payload)
                assert publish_packet.packet_id is not None
                first.send(mqtt.Puback(publish_packet.packet_id))
            first.sock.shutdown(socket.SHUT_RDWR)
            first.close()
            connack = second.connect(client_id, clean_session=False)
            assert connack.return_code == 0 and connack.session_present, client_id
            for payload in sent[5:]:
                publish(payload)
            resumed: list[bytes] = []
            while sent[-1] not in resumed:
                packet = second.recv()
                if isinstance(packet, mqtt.Publish):
                    resumed.append(packet.payload)
                    assert packet.packet_id is not None
                    second.send(mqtt.Puback(packet.packet_id))
            second.close()
            assert came == sent[:5]
            start = sent.index(resumed[0])  # (an older saved position: some again)
            assert resumed == sent[start:], f"{client_id}: skipped or out of order"
        publisher.close()
    finally:
        server.stop()


def submitted(server: WorkersServer) -> int:
    """The publishes the workers submitted (with no client publishing: their barriers and
    takeover notices)."""
    return sum(json.loads(urllib.request.urlopen(f"{url}/stats", timeout=5).read())
               ["publishing"]["submitted"] for url in server.monitoring)


def test_a_storm_of_connects_shares_barriers_and_each_is_answered(tmp_path: Path) -> None:
    """300 CONNECTs sent at once through the port (clean session, named client ids:
    each needs a barrier, none a save): every one gets its CONNACK 0, with far fewer
    barriers than CONNECTs (one in flight per worker, the others joining the next)."""
    server = WorkersServer(tmp_path, ListenMqtt="127.0.0.1:0", MonitorListen="127.0.0.1:0",
                           MaxConnectionsPerAddress="1000",
                           MaxConnectionRatePerAddress="0", MaxHandshakesPerAddress="0")
    try:
        port = mqtt_port(server)
        before = submitted(server)
        clients = [MqttRawClient(port, timeout=15) for _ in range(300)]
        for index, client in enumerate(clients):
            client.send(mqtt.Connect(f"storm-{index}", clean_session=True))
        answers = [client.recv() for client in clients]
        assert answers == [mqtt.Connack(False, 0)] * len(clients)
        # (and takeover notices, coalesced too: migratory/server/mqtt_takeover.py)
        barriers_and_notices = submitted(server) - before
        for client in clients:
            client.close()
        assert 2 <= barriers_and_notices <= len(clients) // 4, barriers_and_notices
    finally:
        server.stop()


def test_a_connect_while_the_sequencer_is_stopped_is_refused_not_held(tmp_path: Path) -> None:
    """The supervisor (the sequencer) SIGSTOPped: a CONNECT's barrier cannot come back;
    the CONNECT is answered CONNACK 3 (server unavailable) within the client's 10 s
    (READ_BARRIER_WAIT is 2 s), not held; once the sequencer goes on, one is taken."""
    server = WorkersServer(tmp_path, ListenMqtt="127.0.0.1:0")
    try:
        port = mqtt_port(server)
        waiting = MqttRawClient(port, timeout=10)  # accepted before the stop
        holder(server, waiting)
        os.kill(server.proc.pid, signal.SIGSTOP)
        try:
            connack = waiting.connect("stalled", clean_session=False)
        finally:
            os.kill(server.proc.pid, signal.SIGCONT)
        waiting.close()
        assert connack == mqtt.Connack(False, mqtt.REFUSED_SERVER_UNAVAILABLE)
        for _ in range(100):  # (the workers catch up with the sequencer again)
            client = MqttRawClient(port, timeout=10)
            connack = client.connect("stalled", clean_session=False)
            client.close()
            if connack.return_code == 0:
                break
            time.sleep(0.1)
        assert connack == mqtt.Connack(False, 0)
    finally:
        server.stop()


def accepted_by(server: WorkersServer, client: MqttRawClient) -> int:
    """The worker that accepted ``client``'s connection (once one has: a bounded wait)."""
    for _ in range(100):
        try:
            return worker_holding(server, client.sock)
        except AssertionError:  # in the listening socket's queue still
            time.sleep(0.02)
    return worker_holding(server, client.sock)


def test_a_connect_on_another_worker_closes_the_connection_of_its_client_id(
    tmp_path: Path,
) -> None:
    """A client id connected on one worker, then again through the port until the kernel
    puts the new connection on the other worker: the first is closed (a takeover notice
    through the sequencer: migratory/server/mqtt_takeover.py). Before, each worker knew
    only its own connections and both stayed open."""
    server = WorkersServer(tmp_path, ListenMqtt="127.0.0.1:0")
    try:
        port = mqtt_port(server)
        for clean in (True, False):
            client_id = f"device-{clean}"
            first = MqttRawClient(port, timeout=10)
            assert first.connect(client_id, clean_session=clean).return_code == 0
            where = worker_holding(server, first.sock)
            for _ in range(50):  # (the kernel picks by the source port)
                second = MqttRawClient(port, timeout=10)
                if accepted_by(server, second) != where:
                    break
                second.close()
            else:
                raise AssertionError("50 connections in a row on one worker")
            assert second.connect(client_id, clean_session=clean).return_code == 0
            assert first.closed_by_server(10), f"{client_id}: the first connection stayed"
            second.send(mqtt.Pingreq())
            assert isinstance(second.recv(), mqtt.Pingresp)
            second.close()
    finally:
        server.stop()
