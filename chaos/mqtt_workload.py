"""MQTT subscribers of the workload (kind ``mqtt``): persistent sessions through paho-mqtt.

Each is an Eclipse Paho client (an independent MQTT 3.1.1 implementation, not our codec)
with a fixed client id (its plan name, ``m<k>``), clean session 0 and QoS 1 subscriptions
to its plan's subjects (topic ``chaos/s3`` is subject ``/chaos/s3``: docs/mqtt.md). It
connects to a member's MQTT listener (behind the member's client proxy, so client-link
faults hit it too) and, when the connection drops or a CONNECT is not answered, to the
next member after a bounded back-off (0.1 s doubling to 1 s), resuming its session there.

Why paho in a thread per connection and not a trio client over
``migratory/protocol/mqtt.py``: that codec is the server's side (it refuses packets only
a server sends), and an independent client is the better witness. Paho runs its own
network thread (``loop_start``); its callbacks only put events on a thread-safe queue,
with their time taken there; the trio task drains the queue every 10 ms and writes the
history (:class:`MqttRecorder`), and calls paho only through ``trio.to_thread`` (its
callbacks run under paho's locks). Paho acknowledges a QoS 1 message (PUBACK) once its
callback returns.

What is recorded: every PUBLISH received, as a ``deliveries`` row of kind ``mqtt`` with
the msg_id from the payload, ``epoch`` and ``seq`` null (MQTT does not carry them: the
checker takes them from the acknowledged publishes by msg_id), type ``snapshot`` for
RETAIN set and ``update`` otherwise, and ``connection`` (1, 2, ...: MQTT QoS 1 allows a
message again on a later connection, not twice on one). Subscription rows: ``SERVER_UP``
/ ``SERVER_DOWN`` per connection, ``subscribed`` per subject at the first SUBACK,
``SUBSCRIBE_DENY`` for a refused filter, ``DATA_RESYNC`` for a retained message after
the SUBACK -- on a resumed session, or a live one a member's cache sync moved past its
cache (our server's only sign that the cache no longer reached back to the saved
position: the snapshot comes instead; before, one on the first connection was not
recorded), ``SESSION_LOST`` for session present 0 on a later connection (the session was
lost: the subscriber subscribes again).

An empty PUBLISH with RETAIN set (MQTT's "no retained value") is the server's resync of a
subject with no snapshot (docs/mqtt.md): its ``DATA_RESYNC`` row is all that is recorded
of it -- no ``deliveries`` row, as it delivers no message (one, with no msg_id, was
reported ``unexpected``), and it is not counted in ``deliveries``. A SUBSCRIBE's empty
RETAIN (before the SUBACK) is recorded as nothing.
"""

from __future__ import annotations

import queue
from collections.abc import Callable
from typing import Any

import trio

from chaos.plan import SubscriberPlan
from chaos.schedule import member
from chaos.workload import Workload, parse_id

KEEPALIVE = 3  # s: paho pings after 3 s without traffic; the server cuts at 4.5 s
CONNECT_TIMEOUT = 3.0  # s from the TCP connect to the CONNACK
BACKOFF = (0.1, 1.0)  # first and largest pause between two connection attempts
POLL = 0.01  # s between two drains of the paho thread's events
STOP_TIMEOUT = 5.0  # s a paho client has to disconnect and stop its network thread

Event = tuple[Any, ...]  # (what, time, ...) put by the paho thread


def topic_of(subject: str) -> str:
    return subject[1:]


class MqttRecorder:
    """The history of one MQTT subscriber (trio thread only; no I/O, tested alone)."""

    def __init__(self, w: Workload, spec: SubscriberPlan) -> None:
        self.w, self.spec = w, spec
        self.connection = 0  # connections that got a CONNACK
        self.member: str | None = None
        self.subscribed = False  # a SUBACK was received (on any connection)
        self.subscribing = False  # a SUBSCRIBE of this connection awaits its SUBACK
        self.resumed = False  # this connection took up the stored session
        w.seen.setdefault(spec.name, set())

    def _sub(self, subject: str | None, event: str, time: float) -> None:
        if event == "subscribed":
            self.w.subscribed_at.setdefault(self.spec.name, time)
        self.w.h.write("subscriptions", subscriber=self.spec.name, kind="mqtt",
                       subject=subject, event=event, member=self.member, time=time)

    def connected(self, member_name: str, session_present: bool, time: float) -> bool:
        """A CONNACK accepted: True if the subscriber must (re)subscribe."""
        self.connection += 1
        self.member = member_name
        self._sub(None, "SERVER_UP", time)
        if self.subscribed and not session_present:
            for s in self.spec.subjects:
                self._sub(s, "SESSION_LOST", time)
            self.w.say(f"mqtt {self.spec.name}: session lost on {member_name} (present 0)")
        self.resumed = self.subscribed and session_present
        self.subscribing = not self.resumed
        return self.subscribing

    def suback(self, codes: list[int], time: float) -> None:
        self.subscribing = False
        for subject, code in zip(self.spec.subjects, codes, strict=False):
            if code >= 0x80:
                self._sub(subject, "SUBSCRIBE_DENY", time)
            elif not self.subscribed:
                self._sub(subject, "subscribed", time)
        self.subscribed = True

    def message(self, topic: str, payload: bytes, retain: bool, time: float) -> None:
        subject = "/" + topic
        if retain and self.subscribed and not self.subscribing:
            self._sub(subject, "DATA_RESYNC", time)
        if retain and not payload:  # a reset: no snapshot, nothing delivered
            self.w.say(f"mqtt {self.spec.name}: {subject} reset (an empty RETAIN: no "
                       f"snapshot) on {self.member}")
            return
        msg_id = parse_id(payload)
        if msg_id:
            self.w.seen[self.spec.name].add(msg_id)
        self.w.stats["deliveries"] += 1
        self.w.h.write(
            "deliveries", subscriber=self.spec.name, kind="mqtt", member=self.member,
            subject=subject, msg_id=msg_id, type="snapshot" if retain else "update",
            connection=self.connection, time=time,
        )

    def disconnected(self, reason: str, time: float) -> None:
        self._sub(None, "SERVER_DOWN", time)
        self.w.say(f"mqtt {self.spec.name} lost {self.member} ({reason[:80]})")
        self.subscribing = False


def paho_client(name: str, events: queue.SimpleQueue[Event], now: Callable[[], float]) -> Any:
    """A paho client of the persistent session ``name`` whose callbacks only queue events."""
    import paho.mqtt.client as paho
    from paho.mqtt.enums import CallbackAPIVersion

    client = paho.Client(
        CallbackAPIVersion.VERSION2,
        client_id=name,
        clean_session=False,
        protocol=paho.MQTTv311,
        reconnect_on_failure=False,
    )
    client.connect_timeout = CONNECT_TIMEOUT

    def on_connect(c: Any, u: Any, flags: Any, rc: Any, p: Any) -> None:
        events.put(("connack", now(), bool(flags.session_present), rc.value))

    def on_subscribe(c: Any, u: Any, mid: int, codes: Any, p: Any) -> None:
        events.put(("suback", now(), [rc.value for rc in codes]))

    def on_message(c: Any, u: Any, m: Any) -> None:
        events.put(("message", now(), m.topic, m.payload, bool(m.retain)))

    def on_disconnect(c: Any, u: Any, flags: Any, rc: Any, p: Any) -> None:
        events.put(("down", now(), f"disconnected: {rc}"))

    client.on_connect, client.on_subscribe = on_connect, on_subscribe
    client.on_message, client.on_disconnect = on_message, on_disconnect
    return client


async def _connection(rec: MqttRecorder, port: int, mname: str, ready: trio.Event) -> str:
    """One connection, until it drops; why it ended."""
    events: queue.SimpleQueue[Event] = queue.SimpleQueue()
    client = paho_client(rec.spec.name, events, rec.w.h.now)
    try:
        # paho's own connect_timeout bounds this (a thread is not cancellable)
        await trio.to_thread.run_sync(client.connect, "127.0.0.1", port, KEEPALIVE)
        await trio.to_thread.run_sync(client.loop_start)
        deadline = trio.current_time() + CONNECT_TIMEOUT
        up = False
        for _ in range(10_000_000):  # until the connection drops (bounded for the linter)
            try:
                ev = events.get_nowait()
            except queue.Empty:
                if not up and trio.current_time() > deadline:
                    return "no CONNACK"
                await trio.sleep(POLL)
                continue
            what, at = ev[0], ev[1]
            if what == "connack":
                if ev[3] != 0:
                    return f"CONNACK {ev[3]}"
                up = True
                if rec.connected(mname, ev[2], at):
                    filters = [(topic_of(s), 1) for s in rec.spec.subjects]
                    await trio.to_thread.run_sync(client.subscribe, filters)
                elif rec.subscribed:
                    ready.set()
            elif what == "suback":
                rec.suback(ev[2], at)
                ready.set()
            elif what == "message":
                rec.message(ev[2], ev[3], ev[4], at)
            elif what == "down":
                if up:
                    rec.disconnected(ev[2], at)
                return str(ev[2])
        return "too many events"
    except OSError as exc:
        return f"connect: {type(exc).__name__}: {exc}"
    finally:
        await stop_paho(client)


async def stop_paho(client: Any) -> None:
    """Disconnect a paho client and stop its network thread (the end of every paho
    connection, subscriber's and publisher's): shielded, as it runs in a ``finally`` of a
    task that may be cancelled, and bounded by :data:`STOP_TIMEOUT`: a thread is not
    cancellable, so one that has not stopped by then is left to finish alone (paho's
    network thread is a daemon) instead of holding the run."""
    with trio.move_on_after(STOP_TIMEOUT) as scope:
        scope.shield = True
        await trio.to_thread.run_sync(_disconnect_and_stop, client, abandon_on_cancel=True)


def _disconnect_and_stop(client: Any) -> None:
    client.disconnect()
    client.loop_stop()


async def mqtt_subscriber(
    w: Workload, spec: SubscriberPlan, ready: trio.Event, ports: list[int]
) -> None:
    """``ports[i]``: member i's MQTT listener (as the clients reach it)."""
    rec = MqttRecorder(w, spec)
    idx, pause = spec.prefer, BACKOFF[0]
    for _ in range(1_000_000):
        mname = member(idx)
        connections = rec.connection
        reason = await _connection(rec, ports[idx], mname, ready)
        if rec.connection > connections:
            pause = BACKOFF[0]  # it was up: start the back-off again
        else:
            w.say(f"mqtt {spec.name}: no session on {mname} ({reason[:80]})")
        idx = (idx + 1) % len(ports)
        await trio.sleep(pause)
        pause = min(BACKOFF[1], 2 * pause)
