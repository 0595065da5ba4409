"""In one process, the hub's steps around a lagging member's waiting resumes and the
other one-step answers of docs/benchmarks.md, "A lagging member's waiting resumes":

- ``looks``: ``--clients`` resumes waiting on one subject ``--ahead`` messages ahead of a
  member numbered elsewhere, then as many messages applied: the whole time, and the
  longest apply (the one that settles them: answered at once for these sinks, which take
  no hand-over);
- ``live``: ``--clients`` live subscribers of one subject, and a cache sync
  (``Hub.reposition``) that jumps ``--ahead`` messages: its time;
- ``history``: one subscribe asking for the whole history of a subject caching
  ``--ahead`` messages of 100 bytes (best of 3);
- ``history-sessions``: ``--clients`` native sessions of one server asking for it at
  once, each a step per round (a connection's budget per turn): the longest step, the
  longest round (``--size``: the messages' content bytes);
- ``live-sessions``: as ``live``, the subscribers real sessions of one server (their
  outboxes: ``--front ws`` (``conflated``: at 500 ms), or ``sse`` / ``sse-multi``,
  streams of one subject or of two, or ``mqtt`` / ``mqtt-persistent``, MQTT sessions
  at QoS 0, ``mqtt-qos1``: clean ones at QoS 1, the messages guaranteed) -- the
  reposition's time, the frames it queued in the outboxes (appends) and their bytes;
  ``--size``: the messages' content bytes. The sessions' sockets take every batch that
  fills (or, ``--full``, none); ``mqtt-qos1`` also times the sessions' refills and then
  a full garbage collection over the in-flight entries they hold (best of 3)::

    .venv/bin/python benchmarks/hub_waiting_resumes.py looks --clients 10000 --ahead 900
    .venv/bin/python benchmarks/hub_waiting_resumes.py live --clients 10000 --ahead 400
    .venv/bin/python benchmarks/hub_waiting_resumes.py history --ahead 10000
    .venv/bin/python benchmarks/hub_waiting_resumes.py history-sessions --clients 10 \
        --ahead 10000
    .venv/bin/python benchmarks/hub_waiting_resumes.py live-sessions --front ws \
        --clients 10000 --ahead 400  # or --front sse / sse-multi / mqtt / mqtt-persistent
"""

from __future__ import annotations

import argparse
import gc
import json
import time

from migratory.config import Config
from migratory.model.message import Message, MessageType, Qos, new_message
from migratory.model.position import Position
from migratory.protocol import mqtt, ops
from migratory.protocol import websocket as ws
from migratory.protocol.http import handshake_request, new_websocket_key
from migratory.protocol.mqtt_encode import encode_packet
from migratory.server.app import Server
from migratory.server.connection import OPERATIONS_PER_TURN
from migratory.server.format_sink import send_op
from migratory.server.hub import Hub
from migratory.server.mqtt_session import MqttSession
from migratory.server.session import Session
from migratory.server.sse_stream import SseStream

SUBJECT = "/Lag/s0"
EPOCH = 7


class Sink:
    __slots__ = ("frames",)

    def __init__(self) -> None:
        self.frames = 0

    def deliver(self, frame: bytes) -> None:
        self.frames += 1


class CountingLink:
    """A session's transport whose socket takes everything at once (a full batch is
    written when it fills: ``flush_now``), counting the frames the outbox held; or, with
    ``full``, one whose socket takes nothing (a drain task owns it: ``writing``)."""

    session: Session | MqttSession

    def __init__(self, full: bool) -> None:
        self.writing = full
        self.frames = 0  # queued in the outbox, one append each
        self.written = 0  # bytes

    def mark_dirty(self) -> None:
        pass

    def flush_now(self) -> None:
        if not self.writing:
            self.taken()

    def taken(self) -> None:
        outbox = self.session.outbox
        self.frames += len(outbox)
        self.written += len(outbox.take())


def numbered(seq: int, size: int = 100, qos: Qos = Qos.STANDARD) -> Message:
    return new_message(SUBJECT, b"x" * size, {}, False, qos, None, EPOCH, seq,
                       MessageType.UPDATE)


def looks(clients: int, ahead: int) -> dict[str, float]:
    hub = Hub(epoch=EPOCH, numbered_elsewhere=True)
    for seq in range(1, 101):
        hub.apply(numbered(seq), 0.0)
    for _ in range(clients):
        hub.subscribe(Sink(), ops.SubscriptionRequest(
            SUBJECT, position=Position(EPOCH, 100 + ahead)), 0.0)
    longest = 0.0
    started = time.perf_counter()
    for seq in range(101, 101 + ahead):
        one = time.perf_counter()
        hub.apply(numbered(seq), 0.0)
        longest = max(longest, time.perf_counter() - one)
    return {"total_ms": (time.perf_counter() - started) * 1000, "longest_apply_ms": longest * 1000}


def live(clients: int, ahead: int) -> dict[str, float]:
    hub = Hub(epoch=EPOCH, numbered_elsewhere=True)
    for seq in range(1, 301):
        hub.apply(numbered(seq), 0.0)
    for _ in range(clients):
        hub.subscribe(Sink(), ops.SubscriptionRequest(SUBJECT), 0.0)
    cached = [numbered(seq) for seq in range(1, 301 + ahead)]
    started = time.perf_counter()
    hub.reposition(SUBJECT, Position(EPOCH, 300 + ahead), None, cached, 0.0)
    return {"reposition_ms": (time.perf_counter() - started) * 1000}


def live_sessions(
    clients: int, ahead: int, front: str, size: int, full: bool
) -> dict[str, float]:
    server = Server(Config.from_mapping({"MaxCachedMessagesPerSubject": str(300 + ahead)}))
    hub = server.ctx.hub
    hub.numbered_elsewhere = True
    qos = Qos.GUARANTEED if front == "mqtt-qos1" else Qos.STANDARD
    for seq in range(1, 301):
        hub.apply(numbered(seq, size, qos), 0.0)
    links = [CountingLink(full) for _ in range(clients)]
    streams = []
    registry: dict[str, MqttSession] = {}
    for n, link in enumerate(links):
        if front.startswith("mqtt"):
            link.session = device = MqttSession(server.ctx, link, "bench", registry)
            device.receive_data(encode_packet(mqtt.Connect(
                f"c{n}", clean_session=front != "mqtt-persistent")), 0.0)
            device.receive_data(encode_packet(mqtt.Subscribe(
                1, ((SUBJECT[1:], int(front == "mqtt-qos1")),))), 0.0)
            device.outbox.take()
            continue
        link.session = session = Session(server.ctx, link, "bench")
        sink: Session | SseStream = session
        if front not in ("ws", "conflated"):
            subjects = [SUBJECT] if front == "sse" else [SUBJECT, "/Lag/other"]
            sink = SseStream(session, subjects)
            streams.append(sink)
        conflation_ms = 500 if front == "conflated" else 0
        hub.subscribe(sink, ops.SubscriptionRequest(SUBJECT, conflation_ms=conflation_ms),
                      0.0)
        session.outbox.take()
        link.frames = 0
    listening = len(hub._subjects[SUBJECT].listeners)
    cached = [numbered(seq, size, qos) for seq in range(1, 301 + ahead)]
    started, cpu = time.perf_counter(), time.process_time()
    hub.reposition(SUBJECT, Position(EPOCH, 300 + ahead), None, cached, 0.0)
    elapsed, cpu = time.perf_counter() - started, time.process_time() - cpu
    drained = drain_backlogs(links) if front == "mqtt-qos1" else {}
    for link in links:
        link.taken()
    held = full_collection() if front == "mqtt-qos1" else {}
    return {"reposition_ms": elapsed * 1000, "cpu_ms": cpu * 1000, **drained, **held,
            "catching_up": sum(stream.catching_up for stream in streams),
            "appends": sum(link.frames for link in links),
            "bytes": sum(link.written for link in links),
            "slow_consumers": server.ctx.stats.slow_consumers,
            **({"mqtt_subscribed": listening} if front.startswith("mqtt") else {})}


def drain_backlogs(links: list[CountingLink]) -> dict[str, float]:
    """What the sessions' writers do after the step, each in its own turns of the loop
    (refill: a QoS 1 session's backlog, mqtt_backlog): their CPU in all, the longest."""
    refills, cpu = 0, time.process_time()
    took = []
    for link in links:
        while True:
            one = time.process_time()
            more = link.session.refill()
            took.append(time.process_time() - one)
            refills += 1
            if not more:
                break
    took.sort()
    return {"refills": refills, "refill_cpu_p99_ms": took[len(took) * 99 // 100] * 1000,
            "longest_refill_cpu_ms": took[-1] * 1000,
            "refills_cpu_ms": (time.process_time() - cpu) * 1000}


def full_collection() -> dict[str, float]:
    """With what the sessions hold after their refills (a QoS 1 session's in-flight
    entries, until the PUBACKs): a full garbage collection's CPU time, best of 3 (the
    wall time of a busy box is mostly waiting for a core), and the objects the collector
    tracks."""
    best = float("inf")
    for _ in range(3):
        started = time.process_time()
        gc.collect()
        best = min(best, time.process_time() - started)
    return {"full_collection_ms": best * 1000, "tracked_objects": len(gc.get_objects())}


def history(cached: int) -> dict[str, float]:
    hub = Hub(epoch=EPOCH, max_cached_messages=cached)
    for _ in range(cached):
        hub.publish(Message(SUBJECT, b"x" * 100), 0.0)
    best = float("inf")
    for _ in range(3):
        sink = Sink()
        started = time.perf_counter()
        for op in hub.subscribe(sink, ops.SubscriptionRequest(SUBJECT, history=cached), 0.0):
            send_op(sink, op)
        best = min(best, time.perf_counter() - started)
        hub.unsubscribe(sink, SUBJECT)
    return {"answer_ms": best * 1000}


def history_sessions(clients: int, cached: int, size: int) -> dict[str, float]:
    """``--clients`` native WebSocket sessions of one server subscribing at once, each
    with the whole history of a subject caching ``--ahead`` messages: each session works
    a step at a time (``Session.process`` with a connection's budget per turn,
    ``OPERATIONS_PER_TURN``), round after round, as the loop's turns let each in; the
    longest step's CPU, the longest round's (every session's step: at most what one
    turn of the loop runs), the CPU in all, and the steps."""
    server = Server(Config.from_mapping({"MaxCachedMessagesPerSubject": str(cached),
                                         "MaxPublishesPerSecond": "0"}))
    for n in range(cached):
        server.ctx.hub.publish(Message(SUBJECT, b"x" * size, {"n": str(n)}), 0.0)
    links = [CountingLink(False) for _ in range(clients)]
    sessions = []
    for link in links:
        link.session = session = Session(server.ctx, link, "bench")
        session.receive_data(handshake_request("127.0.0.1", "/", new_websocket_key())
                             + masked(ops.Connect("c")), 0.0)
        session.outbox.take()
        sessions.append(session)
    subscribe = masked(ops.Subscribe((ops.SubscriptionRequest(SUBJECT, history=cached),)))
    longest_step = longest_round = 0.0
    steps, started = 0, time.process_time()
    waiting = [(session, True) for session in sessions]
    while waiting:
        round_started, more = time.process_time(), []
        for session, first in waiting:
            one = time.process_time()
            if first:
                again = session.receive_data(subscribe, 0.0, budget=OPERATIONS_PER_TURN)
            else:
                again = session.process(0.0, budget=OPERATIONS_PER_TURN)
            session.outbox.take()
            longest_step = max(longest_step, time.process_time() - one)
            steps += 1
            if again:
                more.append((session, False))
        longest_round = max(longest_round, time.process_time() - round_started)
        waiting = more
    return {"longest_step_cpu_ms": longest_step * 1000,
            "longest_round_cpu_ms": longest_round * 1000,
            "cpu_ms": (time.process_time() - started) * 1000, "steps": steps}


def masked(op: ops.ClientOp) -> bytes:
    return ws.encode_masked_binary(ops.encode_client_op(op), b"mask")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("what", choices=("looks", "live", "history", "live-sessions",
                                         "history-sessions"))
    parser.add_argument("--front", default="ws",
                        choices=("ws", "conflated", "sse", "sse-multi", "mqtt",
                                 "mqtt-persistent", "mqtt-qos1"))
    parser.add_argument("--size", type=int, default=100)
    parser.add_argument("--full", action="store_true")
    parser.add_argument("--clients", type=int, default=10_000)
    parser.add_argument("--ahead", type=int, default=900)
    args = parser.parse_args()
    if args.what == "looks":
        figures = looks(args.clients, args.ahead)
    elif args.what == "live":
        figures = live(args.clients, args.ahead)
    elif args.what == "history-sessions":
        figures = history_sessions(args.clients, args.ahead, args.size)
    elif args.what == "live-sessions":
        figures = live_sessions(args.clients, args.ahead, args.front, args.size,
                                args.full)
    else:
        figures = history(args.ahead)
    front = ({"front": args.front, "size": args.size, "full": args.full}
             if args.what == "live-sessions" else {})
    print(json.dumps({"what": args.what, "clients": args.clients, "ahead": args.ahead, **front,
                      **{k: round(v, 1) for k, v in figures.items()}}))


if __name__ == "__main__":
    main()
