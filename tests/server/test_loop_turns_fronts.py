"""The event loop's work per turn is bounded for the other front ends' catch-ups too
(migratory/server/loop_turns.py): a herd of Server-Sent Events streams reconnecting with
their ``Last-Event-ID``, and one of persistent MQTT sessions reconnecting, on real
sockets of one server. Counted, never timed: the events
encoded per turn of the loop; each stream gets exactly what it missed, in order, and a
bystander's ping, publish and ``/readyz`` are answered while the herd resumes."""

from __future__ import annotations

import json
import random
import socket
import urllib.parse
from collections import Counter
from typing import Any

import trio
from test_loop_turns import Turns

from migratory.config import Config
from migratory.listeners import OPEN_LISTENER
from migratory.model.message import Message
from migratory.model.position import Position
from migratory.protocol import mqtt, ops, sse
from migratory.protocol import websocket as ws
from migratory.protocol.http import handshake_request, new_websocket_key
from migratory.protocol.mqtt_encode import encode_packet
from migratory.server.app import Server
from migratory.server.connection import OPERATIONS_PER_TURN, Connection
from migratory.server.loop_turns import TURN_UNITS
from migratory.server.mqtt_connection import MqttConnection
from migratory.server.session_subscriptions import MESSAGES_PER_UNIT, SLICE_UNITS

STREAMS = 100
SUBJECTS = [f"/Herd/s{i}" for i in range(10)]
CACHED = 200
BYSTANDER = "/By/stander"


def stream_request(epoch: int, froms: list[int]) -> bytes:
    query = "&".join("subject=" + urllib.parse.quote(s, safe="") for s in SUBJECTS)
    last = ",".join(f"{epoch}:{n}" for n in froms)
    return (f"GET /events?{query} HTTP/1.1\r\nHost: x\r\nLast-Event-ID: {last}\r\n\r\n"
            ).encode("ascii")


def caught_up(body: bytes) -> list[tuple[str, str, int]]:
    """A stream's events as (event, subject, seq): ``message`` or ``sync``."""
    out = []
    for block in body.split(b"\n\n"):
        name = "message"
        for line in block.split(b"\n"):
            if line.startswith(b"event:"):
                name = line[6:].decode()
            elif line.startswith(b"data:") and name in ("message", "sync"):
                data = json.loads(line[5:])
                out.append((name, data["subject"], data["seq"]))
    return out


def test_a_herd_of_streams_resuming_is_caught_up_a_bounded_amount_per_turn() -> None:
    """100 streams of 10 subjects, ready at once, each subject resumed from its own
    position 50-199 messages back: the events of each stream's backlog were encoded by
    whoever flushed it -- the reader handling its request (~64 kB at once), the batch
    tick, every stream whose socket had room -- unbounded by the loop's turns (40,285
    events in one turn here; 300 such streams held the loop 4.6 s:
    docs/benchmarks.md). Now the writer refills in its turns, counted: a turn encodes at
    most about TURN_UNITS worth; every stream gets every message it missed, once, in
    order, then its sync; a bystander is served while the herd still resumes."""
    server = Server(Config.defaults())
    hub = server.ctx.hub
    for subject in SUBJECTS:
        for _ in range(CACHED):
            hub.publish(Message(subject, b"x"), 0.0)
    rng = random.Random(7)
    froms = [[CACHED - rng.randrange(50, 200) for _ in SUBJECTS] for _ in range(STREAMS)]
    pairs = [socket.socketpair() for _ in range(STREAMS + 2)]  # the herd, then bystanders
    for ours, _ in pairs:
        ours.setblocking(False)
    native, http = pairs[-2][1], pairs[-1][1]
    native.sendall(handshake_request("127.0.0.1", "/", new_websocket_key()) + b"".join(
        ws.encode_masked_binary(ops.encode_client_op(op), b"mask") for op in (
            ops.Connect("bystander"), ops.Subscribe((ops.SubscriptionRequest(BYSTANDER),)))))
    turns = Turns()
    encoded: Counter[int] = Counter()  # events of recovered messages, by turn of the loop
    original = sse.message_lines

    def counting(message: Message) -> bytes:
        encoded[turns.turn] += 1
        return original(message)

    bodies = [b""] * STREAMS
    synced = [0] * STREAMS
    seen: dict[str, int] = {}  # what the bystander got, and the streams synced then

    async def read_stream(n: int, theirs: socket.socket) -> None:
        sock = trio.socket.from_stdlib_socket(theirs)
        while synced[n] < len(SUBJECTS):
            data = await sock.recv(1 << 20)
            assert data, bodies[n][-300:]
            tail = bodies[n][-16:]
            bodies[n] += data
            both = tail + data
            synced[n] += both.count(b"event:sync") - tail.count(b"event:sync")

    async def bystander() -> None:
        sock = trio.socket.from_stdlib_socket(native)
        await sock.send(b"".join(ws.encode_masked_binary(ops.encode_client_op(op), b"mask")
                                 for op in (ops.Ping(5), ops.Publish(Message(BYSTANDER,
                                                                             b"by-msg")))))
        got = b""
        while "published" not in seen:
            got += await sock.recv(1 << 16)
            for key, mark in (("pong", b"dpong"), ("published", b"by-msg")):
                if mark in got and key not in seen:
                    seen[key] = sum(s == len(SUBJECTS) for s in synced)

    async def readyz() -> None:
        sock = trio.socket.from_stdlib_socket(http)
        await sock.send(b"GET /readyz HTTP/1.1\r\nHost: x\r\n\r\n")
        answer = await sock.recv(1 << 16)
        assert answer.startswith(b"HTTP/1.1 200 "), answer
        seen["readyz"] = sum(s == len(SUBJECTS) for s in synced)

    async def main() -> None:
        trio.lowlevel.add_instrument(turns)
        with trio.fail_after(60):  # (a hang, not a speed: nothing here is timed)
            async with trio.open_nursery() as nursery:
                server._nursery = nursery
                for ours, _ in pairs:
                    connection = Connection(server, ours, "127.0.0.1:1", OPEN_LISTENER)
                    server.connections.add(connection)
                    nursery.start_soon(connection.run)
                sock = trio.socket.from_stdlib_socket(native)
                answered = b""
                while b"SUBSCRIBE_ALLOW" not in answered:
                    answered += await sock.recv(1 << 16)
                for (_, theirs), n in zip(pairs, range(STREAMS), strict=False):
                    theirs.sendall(stream_request(hub.epoch, froms[n]))  # all at once
                async with trio.open_nursery() as readers:
                    readers.start_soon(bystander)
                    readers.start_soon(readyz)
                    for n in range(STREAMS):
                        readers.start_soon(read_stream, n, pairs[n][1])
                nursery.cancel_scope.cancel()

    sse.message_lines = counting
    try:
        trio.run(main)
    finally:
        sse.message_lines = original
        for ours, theirs in pairs:
            ours.close()
            theirs.close()
    for n, body in enumerate(bodies):
        got = caught_up(body.partition(b"\r\n\r\n")[2])
        for subject, start in zip(SUBJECTS, froms[n], strict=True):
            assert [(e, s) for e, _, s in got if _ == subject] == [
                *(("message", seq) for seq in range(start + 1, CACHED + 1)),
                ("sync", CACHED)], (n, subject)
    total = sum(CACHED - start for row in froms for start in row)
    assert sum(encoded.values()) == total
    bound = (TURN_UNITS + 2 * OPERATIONS_PER_TURN) * MESSAGES_PER_UNIT
    assert max(encoded.values()) <= bound, max(encoded.values())
    largest = server.turns.budget.largest  # the refills paid for what they did
    assert largest <= TURN_UNITS + OPERATIONS_PER_TURN + SLICE_UNITS, largest
    # the bystander was answered while the herd was still resuming
    assert seen["pong"] < STREAMS and seen["published"] < STREAMS, seen
    assert seen["readyz"] < STREAMS, seen


def test_a_herd_of_persistent_mqtt_sessions_gets_exactly_what_each_missed() -> None:
    """40 persistent MQTT sessions, each recorded at its own positions of 5 subjects (it
    subscribed between two of 200 messages, then left), come back at once after 300 more
    of each: every one gets, on real sockets, exactly the messages after its positions,
    once, in order, before its PINGRESP; a bystander is served while the herd resumes,
    which goes a bounded amount per turn (counted in operations)."""
    server = Server(Config.defaults())
    hub = server.ctx.hub
    topics = [f"mherd/s{i}" for i in range(5)]
    sessions, before, after = 40, 200, 300
    recorded: list[int] = []  # messages of each subject a session had seen
    herd = [socket.socketpair() for _ in range(sessions)]
    bystanders = [socket.socketpair() for _ in range(2)]
    for ours, _ in herd + bystanders:
        ours.setblocking(False)
    got: list[list[mqtt.Publish]] = [[] for _ in range(sessions)]
    done = [False] * sessions
    seen: dict[str, int] = {}

    def publish(count: int) -> None:
        for _ in range(count):
            for topic in topics:
                seq = (hub.position("/" + topic) or Position(0, 0)).seq
                hub.publish(Message("/" + topic, b"%d" % (seq + 1)), 0.0)

    async def exchange(sock: Any, packets: bytes, until: type) -> mqtt.MqttDecoder:
        await sock.send(packets)
        decoder = mqtt.MqttDecoder(server=False)
        while True:
            data = await sock.recv(1 << 16)
            assert data
            decoder.receive_data(data)
            while (packet := decoder.next_event()) is not None:
                if isinstance(packet, until):
                    return decoder

    async def record(nursery: trio.Nursery, n: int) -> None:
        ours, theirs = herd[n]
        nursery.start_soon(MqttConnection(server, ours, "127.0.0.1:1", OPEN_LISTENER).run)
        sock = trio.socket.from_stdlib_socket(theirs)
        await exchange(sock, encode_packet(mqtt.Connect(f"dev{n}", clean_session=False))
                       + encode_packet(mqtt.Subscribe(1, tuple((t, 0) for t in topics))),
                       mqtt.Suback)
        await sock.send(encode_packet(mqtt.Disconnect()))
        while await sock.recv(1 << 16):
            pass
        theirs.close()

    async def come_back(nursery: trio.Nursery, n: int) -> None:
        ours, theirs = herd[n] = socket.socketpair()
        ours.setblocking(False)
        nursery.start_soon(MqttConnection(server, ours, "127.0.0.1:1", OPEN_LISTENER).run)
        sock = trio.socket.from_stdlib_socket(theirs)
        await sock.send(encode_packet(mqtt.Connect(f"dev{n}", clean_session=False))
                        + encode_packet(mqtt.Pingreq()))
        decoder = mqtt.MqttDecoder(server=False)
        while not done[n]:
            data = await sock.recv(1 << 20)
            assert data
            decoder.receive_data(data)
            while (packet := decoder.next_event()) is not None:
                if isinstance(packet, mqtt.Publish):
                    got[n].append(packet)
                done[n] = done[n] or isinstance(packet, mqtt.Pingresp)

    async def bystander(nursery: trio.Nursery) -> None:
        (ours, theirs), (web, http) = bystanders
        nursery.start_soon(Connection(server, ours, "127.0.0.1:1", OPEN_LISTENER).run)
        nursery.start_soon(Connection(server, web, "127.0.0.1:1", OPEN_LISTENER).run)
        sock = trio.socket.from_stdlib_socket(theirs)
        await sock.send(handshake_request("127.0.0.1", "/", new_websocket_key()) + b"".join(
            ws.encode_masked_binary(ops.encode_client_op(op), b"mask") for op in (
                ops.Connect("by"), ops.Subscribe((ops.SubscriptionRequest(BYSTANDER),)),
                ops.Ping(5), ops.Publish(Message(BYSTANDER, b"by-msg")))))
        answer = b""
        while b"by-msg" not in answer:
            answer += await sock.recv(1 << 16)
        seen["published"] = sum(done)
        web_sock = trio.socket.from_stdlib_socket(http)
        await web_sock.send(b"GET /readyz HTTP/1.1\r\nHost: x\r\n\r\n")
        assert (await web_sock.recv(1 << 16)).startswith(b"HTTP/1.1 200 ")
        seen["readyz"] = sum(done)

    async def main() -> None:
        with trio.fail_after(60):  # (a hang, not a speed: nothing here is timed)
            async with trio.open_nursery() as nursery:
                server._nursery = nursery
                for n in range(sessions):
                    publish(before // sessions)
                    recorded.append((hub.position("/" + topics[0]) or Position(0, 0)).seq)
                    await record(nursery, n)
                publish(after)
                async with trio.open_nursery() as clients:
                    for n in range(sessions):
                        clients.start_soon(come_back, nursery, n)
                    clients.start_soon(bystander, nursery)
                nursery.cancel_scope.cancel()

    try:
        trio.run(main)
    finally:
        for ours, theirs in herd + bystanders:
            ours.close()
            theirs.close()
    last = before + after
    for n in range(sessions):
        for topic in topics:
            assert [p.payload for p in got[n] if p.topic == topic] == [
                b"%d" % seq for seq in range(recorded[n] + 1, last + 1)], (n, topic)
    assert seen["published"] < sessions and seen["readyz"] < sessions, seen
    largest = server.turns.budget.largest
    assert largest <= TURN_UNITS + OPERATIONS_PER_TURN + SLICE_UNITS, largest
