"""MQTT publishers of the workload (kind ``mqtt``): QoS 1 PUBLISH through paho-mqtt, as a
device publishes (docs/mqtt.md: a PUBACK only once the message is acknowledged the way a
native ``PUBLISH_OK`` is -- in a Guaranteed cluster, once a seed majority holds it).

Each is an Eclipse Paho client (an independent MQTT 3.1.1 implementation) with client id
``<name>-<connection>`` and clean session 1, on a member's MQTT listener behind the
member's client proxy; when the connection drops, the next member after a bounded
back-off. Every publish is QoS 1 (MQTT has no "standard" acknowledgement to wait for) and
keeps the arrival's retained flag; MQTT carries no fields, so none are sent.

What is recorded, per the ``publishes`` table: the PUBACK of a publish is ``ok`` with no
epoch or seq (MQTT does not carry them: the checker takes them from the deliveries of
subscribers that see positions, spark_analysis/load.py); a publish whose connection ends
before its PUBACK is ``info`` (outcome unknown: paho is not asked to send it again on the
next connection, so a msg_id is published at most once); an arrival while no connection
is up is ``fail`` (not sent).

Paho runs its own network thread; its callbacks only queue events, which the trio task
drains every :data:`~chaos.mqtt_workload.POLL` s (:class:`PublishLedger` matches PUBACKs
to publishes: sans-I/O, tested alone). A PUBACK can be queued before ``publish`` has
returned its message id to us: the ledger keeps it until the publish is entered.
"""

from __future__ import annotations

import queue
from collections.abc import Callable
from functools import partial
from typing import Any

import trio

from chaos.mqtt_workload import (
    BACKOFF,
    CONNECT_TIMEOUT,
    KEEPALIVE,
    POLL,
    Event,
    stop_paho,
    topic_of,
)
from chaos.plan import PublisherPlan
from chaos.schedule import member
from chaos.workload import MAX_IN_FLIGHT, PUBLISH_TIMEOUT, Workload

KIND = "mqtt"


class PublishLedger:
    """One connection's QoS 1 publishes awaiting their PUBACK, by paho message id."""

    def __init__(self, w: Workload, publisher: str, member_name: str) -> None:
        self.w, self.publisher, self.member = w, publisher, member_name
        # mid -> (msg_id, subject, invoke time, deadline)
        self.pending: dict[int, tuple[str, str, float, float]] = {}
        self.early: set[int] = set()  # PUBACKs of mids not entered yet
        self.ended: str | None = None  # why the connection ended, once it has

    def sent(self, mid: int, msg_id: str, subject: str, invoked: float) -> None:
        if mid in self.early:
            self.early.discard(mid)
            self._ok(msg_id, subject, invoked)
        elif self.ended is not None:  # the connection went while paho took it
            self._info(msg_id, subject, self.ended)
        else:
            self.pending[mid] = (msg_id, subject, invoked, invoked + PUBLISH_TIMEOUT)

    def puback(self, mid: int) -> None:
        entry = self.pending.pop(mid, None)
        if entry is None:
            self.early.add(mid)
        else:
            self._ok(entry[0], entry[1], entry[2])

    def _ok(self, msg_id: str, subject: str, invoked: float) -> None:
        self.w.record_publish(self.publisher, "ok", msg_id, subject, self.member, invoked)

    def expire(self, now: float) -> None:
        for mid, (msg_id, subject, _, deadline) in list(self.pending.items()):
            if deadline < now:
                del self.pending[mid]
                self._info(msg_id, subject, f"no PUBACK in {PUBLISH_TIMEOUT} s")

    def unknown(self, reason: str) -> None:
        """The connection ended: every publish awaiting its PUBACK, and any entered from
        now on, is of unknown outcome."""
        self.ended = self.ended or reason
        pending, self.pending = self.pending, {}
        for msg_id, subject, _, _ in pending.values():
            self._info(msg_id, subject, reason)

    def _info(self, msg_id: str, subject: str, reason: str) -> None:
        self.w.record_publish(self.publisher, "info", msg_id, subject, self.member,
                              reason=reason[:200])


def paho_publisher(client_id: str, events: queue.SimpleQueue[Event],
                   now: Callable[[], float]) -> Any:
    import paho.mqtt.client as paho
    from paho.mqtt.enums import CallbackAPIVersion

    client = paho.Client(CallbackAPIVersion.VERSION2, client_id=client_id, clean_session=True,
                         protocol=paho.MQTTv311, reconnect_on_failure=False)
    client.connect_timeout = CONNECT_TIMEOUT
    client.max_inflight_messages_set(MAX_IN_FLIGHT)
    client.max_queued_messages_set(MAX_IN_FLIGHT)

    def on_connect(c: Any, u: Any, flags: Any, rc: Any, p: Any) -> None:
        events.put(("connack", now(), rc.value))

    def on_publish(c: Any, u: Any, mid: int, rc: Any, p: Any) -> None:
        events.put(("puback", now(), mid))

    def on_disconnect(c: Any, u: Any, flags: Any, rc: Any, p: Any) -> None:
        events.put(("down", now(), f"disconnected: {rc}"))

    client.on_connect, client.on_publish, client.on_disconnect = (
        on_connect, on_publish, on_disconnect)
    return client


class MqttPublisher:
    def __init__(self, w: Workload, spec: PublisherPlan, ports: list[int]) -> None:
        self.w, self.spec, self.ports = w, spec, ports
        self.arrivals = w.arrivals(spec)
        self.client: Any = None  # the paho client while a connection is up
        self.ledger: PublishLedger | None = None
        self.connections = 0

    async def run(self) -> None:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(self._connections)
            await self._publishing()
            with trio.move_on_after(PUBLISH_TIMEOUT + 1):
                while self.ledger is not None and self.ledger.pending:
                    await trio.sleep(0.1)
            if self.ledger is not None:
                self.ledger.unknown("no PUBACK before the run ended")
            nursery.cancel_scope.cancel()

    async def _publishing(self) -> None:
        w, name = self.w, self.spec.name
        while w.publishing:
            await trio.sleep_until(self.arrivals.due(trio.current_time()))
            msg_id, subject, content, _fields, retained, _ = self.arrivals.next()
            client, ledger = self.client, self.ledger
            target = ledger.member if ledger is not None else None
            w.record_publish(name, "invoke", msg_id, subject, target, qos="guaranteed")
            if client is None or ledger is None or len(ledger.pending) >= MAX_IN_FLIGHT:
                why = "no connection" if client is None else "too many in flight"
                w.record_publish(name, "fail", msg_id, subject, target, reason=f"not sent: {why}")
                continue
            invoked = w.h.now()
            info = await trio.to_thread.run_sync(
                partial(client.publish, topic_of(subject), content, qos=1, retain=retained))
            if info.rc != 0:  # not queued by paho (the connection went meanwhile)
                w.record_publish(name, "fail", msg_id, subject, target,
                                 reason=f"not sent: paho rc {info.rc}")
                continue
            ledger.sent(info.mid, msg_id, subject, invoked)

    async def _connections(self) -> None:
        idx, pause = self.spec.prefer, BACKOFF[0]
        for _ in range(1_000_000):
            before = self.connections
            reason = await self._connection(self.ports[idx], member(idx))
            if self.connections == before:
                self.w.say(f"mqtt publisher {self.spec.name}: no connection to {member(idx)} "
                           f"({reason[:80]})")
            else:
                pause = BACKOFF[0]
            idx = (idx + 1) % len(self.ports)
            await trio.sleep(pause)
            pause = min(BACKOFF[1], 2 * pause)

    async def _connection(self, port: int, mname: str) -> str:
        events: queue.SimpleQueue[Event] = queue.SimpleQueue()
        client_id = f"{self.spec.name}-{self.connections + 1}"
        client = paho_publisher(client_id, events, self.w.h.now)
        ledger = PublishLedger(self.w, self.spec.name, mname)
        try:
            await trio.to_thread.run_sync(client.connect, "127.0.0.1", port, KEEPALIVE)
            await trio.to_thread.run_sync(client.loop_start)
            deadline = trio.current_time() + CONNECT_TIMEOUT
            for _ in range(100_000_000):  # until the connection drops (bounded for the linter)
                try:
                    ev = events.get_nowait()
                except queue.Empty:
                    if self.client is None and trio.current_time() > deadline:
                        return "no CONNACK"
                    ledger.expire(self.w.h.now())
                    await trio.sleep(POLL)
                    continue
                if ev[0] == "connack":
                    if ev[2] != 0:
                        return f"CONNACK {ev[2]}"
                    self.connections += 1
                    self.client, self.ledger = client, ledger
                elif ev[0] == "puback":
                    ledger.puback(ev[2])
                elif ev[0] == "down":
                    return str(ev[2])
            return "too many events"
        except OSError as exc:
            return f"connect: {type(exc).__name__}: {exc}"
        finally:
            if self.client is client:
                self.client = None
            ledger.unknown("connection lost before the PUBACK")
            await stop_paho(client)


async def mqtt_publisher(w: Workload, spec: PublisherPlan, ports: list[int]) -> None:
    """``ports[i]``: member i's MQTT listener (as the clients reach it)."""
    await MqttPublisher(w, spec, ports).run()
