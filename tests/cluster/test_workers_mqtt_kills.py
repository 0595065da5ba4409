"""Workers = N: MQTT persistent sessions (clean session 0, QoS 1 deliveries) across
SIGKILLed workers, with real processes on 127.0.0.1 (docs/workers.md). Each device
resumes through the shared port on whichever worker the kernel picks and must get every
acknowledged message, in order (QoS 1: some again); a message it never PUBACKed must
come again; a clean session (clean session 1) beside it must not be resumed."""

from __future__ import annotations

import os
import signal
from pathlib import Path

from test_workers import WorkersServer, alive
from workers_mqtt import Device, Publisher, firsts, mqtt_port, worker_holding


def acked_in_order(device: Device, publisher: Publisher) -> None:
    """Every acknowledged message came, the first time in publishing order (a publish
    whose outcome was lost with its worker may come too, or not)."""
    acked = set(publisher.acked)
    assert [p for p in firsts(device.payloads) if p in acked] == publisher.acked, (
        f"{device.client_id}: out of order across the kills")


def started(tmp_path: Path, client_id: str = "scoreboard") -> tuple[WorkersServer, Device]:
    server = WorkersServer(tmp_path, ListenMqtt="127.0.0.1:0")
    device = Device(mqtt_port(server), client_id)
    assert device.connect() is False
    device.subscribe(qos=1)
    return server, device


def test_a_device_that_comes_back_while_every_worker_restarts_resumes_without_loss(
    tmp_path: Path,
) -> None:
    """Every worker killed at once: the device reconnects at once, again and again, so
    its attempts land on workers not started yet or still catching up (refused), until
    the first one back takes the session."""
    server, device = started(tmp_path)
    try:
        publisher = Publisher(server.port)
        device.receive_until(publisher.publish(20), stage="before the kills")
        victims = list(server.pids.values())
        for pid in victims:
            os.kill(pid, signal.SIGKILL)
        assert device.reconnect() is True, "the session did not survive its workers"
        print(f"{device.refused} attempts refused while the workers restarted")
        assert device.refused >= 1  # it did come back while they restarted
        publisher.publish(10)
        device.receive_until(publisher.acked, stage="after the resume")
        acked_in_order(device, publisher)
        assert not any(alive(pid) for pid in victims)
    finally:
        device.close()
        server.stop()


def test_qos1_deliveries_not_acknowledged_when_the_worker_dies_come_again(
    tmp_path: Path,
) -> None:
    """20 delivered: 10 PUBACKed, then 5 PUBACKs sent as the worker is killed (in flight:
    each may or may not count), 5 never sent. Those 5 must be delivered again."""
    server, device = started(tmp_path)
    try:
        assert device.client is not None
        victim = worker_holding(server, device.client.sock)
        publisher = Publisher(server.port, avoid=victim)
        sent = publisher.publish(20)
        device.receive_until(sent[:10], stage="the acknowledged ten")
        device.receive_until(sent, stage="the ten held", ack=False)
        never_acked = sent[15:]
        device.held = device.held[:5]
        device.ack_held()  # ... and at once:
        os.kill(server.pids[victim], signal.SIGKILL)
        publisher.publish(10)  # while the device is away
        assert device.reconnect() is True, "the session did not survive its worker"
        resumed_at = len(device.payloads)
        publisher.publish(5)
        device.receive_until(publisher.acked, stage="after the resume")
        again = device.payloads[resumed_at:]
        assert set(never_acked) <= set(again), (
            f"never PUBACKed, not delivered again: {sorted(set(never_acked) - set(again))}")
        acked_in_order(device, publisher)
    finally:
        device.close()
        server.stop()


def test_a_session_killed_twice_in_a_row_resumes_each_time(tmp_path: Path) -> None:
    """The device's worker killed; as soon as the device has its session back (CONNACK,
    nothing read yet), the worker that took it is killed too: each worker died under it
    once (or the restarted one twice)."""
    server, device = started(tmp_path)
    try:
        assert device.client is not None
        first = worker_holding(server, device.client.sock)
        publisher = Publisher(server.port, avoid=first)
        device.receive_until(publisher.publish(20), stage="before the first kill")
        os.kill(server.pids[first], signal.SIGKILL)
        publisher.publish(10)
        assert device.reconnect() is True, "the session did not survive the first kill"
        second = worker_holding(server, device.client.sock)
        os.kill(server.pids[second], signal.SIGKILL)
        print(f"killed worker {first}, then worker {second}")
        publisher.publish(10)  # (its worker may have been the second)
        assert device.reconnect() is True, "the session did not survive the second kill"
        publisher.publish(5)
        device.receive_until(publisher.acked, stage="after the second resume")
        acked_in_order(device, publisher)
    finally:
        device.close()
        server.stop()


def test_a_clean_session_beside_a_killed_persistent_one_is_not_resumed(
    tmp_path: Path,
) -> None:
    """A clean-session client on the same worker as the persistent one: after the kill it
    reconnects (clean session 1) with no session, no subscription and nothing it missed,
    and later with clean session 0, still no session. The persistent one resumes."""
    server, device = started(tmp_path)
    port = mqtt_port(server)
    ticker = Device(port, "ticker", clean_session=True)
    try:
        assert device.client is not None
        victim = worker_holding(server, device.client.sock)
        for _ in range(200):  # the kernel picks: until it is on the same worker
            assert ticker.connect() is False
            assert ticker.client is not None
            if worker_holding(server, ticker.client.sock) == victim:
                break
        else:
            raise AssertionError("the clean session never landed on the device's worker")
        ticker.subscribe(qos=1)
        publisher = Publisher(server.port, avoid=victim)
        before = publisher.publish(20)
        device.receive_until(before, stage="persistent, before the kill")
        ticker.receive_until(before, stage="clean, before the kill")
        os.kill(server.pids[victim], signal.SIGKILL)
        missed = publisher.publish(20)  # while both are away
        assert ticker.reconnect() is False, "a clean session was resumed"
        assert device.reconnect() is True, "the persistent session did not survive"
        later = publisher.publish(5)
        device.receive_until(publisher.acked, stage="persistent, after the resume")
        acked_in_order(device, publisher)
        assert ticker.nothing_more() == [], "a clean session got messages unsubscribed"
        ticker.subscribe(qos=1)
        last = publisher.publish(3)
        ticker.receive_until(last, stage="clean, subscribed again")
        assert ticker.payloads == before + last, "a clean session got what it missed"
        assert not set(missed + later) & set(ticker.payloads)
        ticker.clean_session = False
        assert ticker.reconnect() is False, "a clean session left a session behind"
    finally:
        ticker.close()
        device.close()
        server.stop()
