"""MQTT subscribers of the chaos workload (chaos/mqtt_workload.py): the recorder's
history rows, the paho callbacks' events, the plan, the members' MQTT ports and the
``--mqtt-subscribers`` option. No broker, no member process."""

from __future__ import annotations

import queue
import threading
from pathlib import Path
from typing import Any

import pytest
import trio
import trio.testing
from offline_workload import history_rows, offline_workload

from chaos import __main__ as cli
from chaos.members import build_members, mqtt_port
from chaos.mqtt_workload import STOP_TIMEOUT, MqttRecorder, paho_client, stop_paho
from chaos.plan import SubscriberPlan, plan_workload
from chaos.workload import Workload


def _workload(tmp_path: Path, mqtt: int = 1) -> Workload:
    return offline_workload(tmp_path, mqtt_subscribers=mqtt)


_rows = history_rows


def test_the_recorder_numbers_connections_and_tells_a_resync_from_a_first_snapshot(
    tmp_path: Path,
) -> None:
    w = _workload(tmp_path)
    s0, s1 = "/chaos/s0", "/chaos/s1"
    spec = SubscriberPlan("m0", "mqtt", 1, (s0, s1), 0, 0.0)
    rec = MqttRecorder(w, spec)
    assert rec.connected("migratory-1", False, 1.0)  # a new session: subscribe
    rec.message(s0[1:], b"p0-1|chaos", True, 1.1)  # the first subscribe's snapshot
    rec.suback([1, 0x80], 1.2)
    rec.message(s0[1:], b"p0-2|chaos", False, 1.3)
    rec.disconnected("keepalive", 2.0)
    assert not rec.connected("migratory-2", True, 3.0)  # resumed: no SUBSCRIBE
    rec.message(s0[1:], b"p0-2|chaos", False, 3.1)  # again, on a new connection
    rec.message(s0[1:], b"p0-3|chaos", True, 3.2)  # a resync: the snapshot
    rec.message(s0[1:], b"not ours", False, 3.3)
    rec.disconnected("reset", 4.0)
    assert rec.connected("migratory-0", False, 5.0)  # the session is gone: subscribe again
    rec.suback([1, 1], 5.1)
    dels = [(d["subject"], d["msg_id"], d["type"], d["connection"], d["member"], d["kind"])
            for d in _rows(w, "deliveries")]
    assert dels == [
        (s0, "p0-1", "snapshot", 1, "migratory-1", "mqtt"),
        (s0, "p0-2", "update", 1, "migratory-1", "mqtt"),
        (s0, "p0-2", "update", 2, "migratory-2", "mqtt"),
        (s0, "p0-3", "snapshot", 2, "migratory-2", "mqtt"),
        (s0, None, "update", 2, "migratory-2", "mqtt"),
    ]
    subs = [(r["subject"], r["event"], r["time"]) for r in _rows(w, "subscriptions")]
    assert subs == [
        (None, "SERVER_UP", 1.0),
        (s0, "subscribed", 1.2),
        (s1, "SUBSCRIBE_DENY", 1.2),
        (None, "SERVER_DOWN", 2.0),
        (None, "SERVER_UP", 3.0),
        (s0, "DATA_RESYNC", 3.2),
        (None, "SERVER_DOWN", 4.0),
        (None, "SERVER_UP", 5.0),
        (s0, "SESSION_LOST", 5.0),
        (s1, "SESSION_LOST", 5.0),
    ]
    assert w.seen[spec.name] == {"p0-1", "p0-2", "p0-3"}
    assert w.subscribed_at[spec.name] == 1.2
    assert w.stats["deliveries"] == 5
    w.h.close()


def test_an_empty_retain_is_recorded_as_a_resync_and_no_delivery(tmp_path: Path) -> None:
    """The server's resync of a subject with no snapshot is an empty PUBLISH with RETAIN
    (docs/mqtt.md): a DATA_RESYNC row, no deliveries row (before: a delivery with no
    msg_id, which the checker reports "unexpected"). And a RETAIN after the SUBACK on the
    first connection -- a member's cache sync moved the live session past its cache --
    is a resync as on a resumed one (before: not recorded, so its skipped messages were
    reported lost)."""
    w = _workload(tmp_path)
    s0 = "/chaos/s0"
    rec = MqttRecorder(w, SubscriberPlan("m0", "mqtt", 1, (s0,), 0, 0.0))
    assert rec.connected("migratory-1", False, 1.0)
    rec.suback([1], 1.1)
    rec.message(s0[1:], b"p0-1|chaos", False, 1.2)
    rec.message(s0[1:], b"", True, 1.3)  # a live resync, no snapshot
    rec.message(s0[1:], b"p0-5|chaos", True, 1.4)  # a live resync, the snapshot
    rec.disconnected("reset", 2.0)
    assert not rec.connected("migratory-2", True, 3.0)
    rec.message(s0[1:], b"", True, 3.1)  # a resume's resync, no snapshot
    rec.message(s0[1:], b"p0-9|chaos", False, 3.2)
    dels = [(d["msg_id"], d["type"], d["connection"]) for d in _rows(w, "deliveries")]
    assert dels == [("p0-1", "update", 1), ("p0-5", "snapshot", 1), ("p0-9", "update", 2)]
    resyncs = [(r["subject"], r["time"]) for r in _rows(w, "subscriptions")
               if r["event"] == "DATA_RESYNC"]
    assert resyncs == [(s0, 1.3), (s0, 1.4), (s0, 3.1)]
    assert w.stats["deliveries"] == 3
    w.h.close()


def test_the_drain_waits_for_guaranteed_messages_only_from_mqtt(tmp_path: Path) -> None:
    w = _workload(tmp_path)
    (spec,) = [s for s in w.plan.subscribers if s.kind == "mqtt"]
    subject = spec.subjects[0]
    for sub in w.plan.subscribers:
        w.subscribed_at[sub.name] = 0.0
        w.seen[sub.name] = set()
    w.publishing = False
    w.record_publish("p0", "invoke", "p0-1", subject, None, qos="standard")
    w.record_publish("p0", "ok", "p0-1", subject, None, 0.5, epoch=1, seq=1)
    for sub in w.plan.subscribers:
        if sub.kind != "mqtt" and subject in sub.subjects:
            w.seen[sub.name].add("p0-1")
    assert w.drained()  # a QoS 0 message MQTT may lose
    w.record_publish("p0", "invoke", "p0-2", subject, None, qos="guaranteed")
    w.record_publish("p0", "ok", "p0-2", subject, None, 0.6, epoch=1, seq=2)
    for sub in w.plan.subscribers:
        if sub.kind != "mqtt" and subject in sub.subjects:
            w.seen[sub.name].add("p0-2")
    assert not w.drained()
    w.seen[spec.name].add("p0-2")
    assert w.drained()
    w.h.close()


def test_paho_callbacks_only_queue_timed_events() -> None:
    import paho.mqtt.client as paho

    events: queue.SimpleQueue[tuple[Any, ...]] = queue.SimpleQueue()
    client = paho_client("m0", events, lambda: 7.5)
    assert client._clean_session is False and client._client_id == b"m0"
    msg = paho.MQTTMessage(mid=1, topic=b"chaos/s1")
    msg.payload, msg.retain = b"p1-9|chaos", True
    client.on_message(client, None, msg)
    assert events.get_nowait() == ("message", 7.5, "chaos/s1", b"p1-9|chaos", True)
    assert events.empty()


class StuckPaho:
    """A paho client whose network thread does not stop: ``loop_stop`` says it is
    stuck, then waits for ``release`` (at most 10 s)."""

    def __init__(self) -> None:
        self.stuck, self.release = threading.Event(), threading.Event()
        self.calls: list[str] = []

    def disconnect(self) -> None:
        self.calls.append("disconnect")

    def loop_stop(self) -> None:
        self.calls.append("loop_stop")
        self.stuck.set()
        self.release.wait(10)
        self.calls.append("stopped")


def test_stopping_a_paho_client_is_shielded_and_bounded() -> None:
    """stop_paho (the end of every MQTT subscriber's and publisher's connection) runs
    even in a cancelled task, and a paho thread that does not stop is left after
    STOP_TIMEOUT, not waited for. Before: each module's own stop waited for the thread
    whatever its ``move_on_after(5)`` said (a thread is not cancellable): ``stopped``."""
    client = StuckPaho()
    returned: list[float] = []

    async def stop_in_a_cancelled_task() -> None:
        with trio.CancelScope() as scope:
            scope.cancel()  # the connection's task is being cancelled: the stop still runs
            await stop_paho(client)
        returned.append(trio.current_time())

    async def main(clock: trio.testing.MockClock) -> None:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(stop_in_a_cancelled_task)
            await trio.to_thread.run_sync(client.stuck.wait)  # in paho's loop_stop
            clock.jump(STOP_TIMEOUT)

    clock = trio.testing.MockClock()
    trio.run(main, clock, clock=clock)
    assert returned == [STOP_TIMEOUT] and client.calls == ["disconnect", "loop_stop"]
    client.release.set()


def test_mqtt_subscribers_join_the_plan_without_changing_the_others() -> None:
    base = plan_workload(5, members=5)
    more = plan_workload(5, members=5, mqtt_subscribers=4)
    assert more.subscribers[: len(base.subscribers)] == base.subscribers
    mqtt = more.subscribers[len(base.subscribers):]
    assert [s.name for s in mqtt] == ["m0", "m1", "m2", "m3"]
    assert {s.kind for s in mqtt} == {"mqtt"} and all(s.history == 0 for s in mqtt)
    assert set().union(*(s.subjects for s in mqtt)) == set(more.subjects)
    assert [s.start_after > 0 for s in mqtt] == [False, False, True, False]


def test_members_get_an_mqtt_listener_behind_a_client_proxy_only_when_asked(
    tmp_path: Path,
) -> None:
    def build(mqtt: bool, proxies: bool = True) -> Any:
        return build_members(count=3, seeds=3, base=20_000, proxies=proxies, out=tmp_path,
                             env={}, on_crash=lambda m, s: None, mqtt=mqtt)

    members, proxies, urls = build(False)
    assert all("ListenMqtt" not in m.settings for m in members)
    assert all(len(p) == 3 for p in proxies.values())
    members, proxies, urls = build(True)
    assert members[1].settings["ListenMqtt"] == "127.0.0.1:20015"
    assert mqtt_port(urls[1]) == 23015  # the proxy's
    assert [p.name for p in proxies[1][2:]] == ["migratory-1/client", "migratory-1/mqtt"]
    members, proxies, urls = build(True, proxies=False)
    assert mqtt_port(urls[2]) == 20025 and members[2].settings["ListenMqtt"].endswith(":20025")


def test_the_option_reaches_the_runner(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    import chaos.runner

    got: list[dict[str, Any]] = []
    monkeypatch.setattr(chaos.runner, "run", lambda **kw: got.append(kw) or 0)
    base = ["run", "--seed", "1", "--duration", "5", "--out", str(tmp_path / "r")]
    assert cli.main(base) == 0
    assert cli.main([*base, "--mqtt-subscribers", "4"]) == 0
    assert [kw["mqtt_subscribers"] for kw in got] == [0, 4]
