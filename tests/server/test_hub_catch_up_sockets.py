"""A cache sync moving a subject past its live subscribers, on real sockets of one
server (a cluster member's hub): native WebSocket clients, a one-subject and a
two-subject SSE stream, clean and persistent MQTT sessions get, after their
subscription, exactly the bytes the per-message path gave them (``per_message``, the
same scenario run with it): the jumped-over messages, then the live ones, in order --
the runs (format_sink.MissedRun) and the two-subject stream's backlog change how the
bytes are queued, not which. A client that reads nothing is cut off as a slow consumer
by the jump in both, the others served. (Counted and compared, never timed.)"""

from __future__ import annotations

import socket
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import pytest
import trio
from test_hub_catch_up import per_message
from test_mqtt_catch_up import per_message as told_per_message

from migratory.config import Config
from migratory.listeners import OPEN_LISTENER
from migratory.model.message import Message, MessageType, Qos, new_message
from migratory.model.position import Position
from migratory.protocol import mqtt, ops
from migratory.protocol import websocket as ws
from migratory.protocol.http import handshake_request, new_websocket_key
from migratory.protocol.mqtt_encode import encode_packet
from migratory.server import format_sink
from migratory.server import hub as hub_module
from migratory.server.app import Server
from migratory.server.connection import Connection
from migratory.server.mqtt_connection import MqttConnection

SUBJECT = "/Lag/live"
OTHER = "/Lag/other"
EPOCH = 9
HELD = 20
JUMP = 400
LAST = HELD + JUMP + 2  # two live messages after the sync
NATIVES = 12
DEVICES = 3  # MQTT sessions at QoS 0: two clean, one persistent


def numbered(seq: int, subject: str = SUBJECT) -> Message:
    return new_message(subject, b"%d:" % seq + b"y" * (seq % 7 * 40), {"n": str(seq)},
                       False, Qos.STANDARD, None, EPOCH, seq, MessageType.UPDATE)


def websocket_client(name: str) -> bytes:
    return handshake_request("127.0.0.1", "/", new_websocket_key()) + b"".join(
        ws.encode_masked_binary(ops.encode_client_op(op), b"mask") for op in (
            ops.Connect(name), ops.Subscribe((ops.SubscriptionRequest(SUBJECT),))))


def stream_client(subjects: list[str]) -> bytes:
    query = "&".join(f"subject={s}" for s in subjects)
    return f"GET /events?{query} HTTP/1.1\r\nHost: x\r\n\r\n".encode()


def mqtt_client(name: str, *, clean: bool) -> bytes:
    return (encode_packet(mqtt.Connect(name, clean_session=clean))
            + encode_packet(mqtt.Subscribe(1, ((SUBJECT[1:], 0),))))


def after_subscribe_frames(wire: bytes) -> list[bytes]:
    """A WebSocket client's frames (payloads; a server frame's header follows from its
    payload) after its SUBSCRIBE_ALLOW."""
    payloads = [e.data for e in ws.FrameDecoder(client_frames=False).events(
        wire.partition(b"\r\n\r\n")[2]) if isinstance(e, ws.BinaryMessage)]
    for n, payload in enumerate(payloads):
        op = ops.decode_server_op(payload)
        if isinstance(op, ops.SubjectStatus) and op.status is ops.Status.SUBSCRIBE_ALLOW:
            return payloads[n + 1:]
    raise AssertionError("no SUBSCRIBE_ALLOW")


def after_subscribe_events(wire: bytes) -> list[bytes]:
    """A stream's events, byte for byte, after its last ``subscribe`` (heartbeat
    comments left out)."""
    events = [e for e in wire.partition(b"\r\n\r\n")[2].split(b"\n\n")
              if e and not e.startswith(b":")]
    last = max(n for n, e in enumerate(events) if e.startswith(b"event:subscribe"))
    return events[last + 1:]


@asynccontextmanager
async def serving(server: Server) -> AsyncIterator[trio.Nursery]:
    """The server's tasks for its connections and batches, ended on the way out."""
    with trio.fail_after(60):  # (a hang, not a speed)
        async with trio.open_nursery() as nursery:
            server._nursery = nursery
            nursery.start_soon(server._batch_loop)
            nursery.start_soon(server._idle_write_loop)
            yield nursery
            nursery.cancel_scope.cancel()


def run_then_close(main: Any, pairs: list[tuple[socket.socket, socket.socket]]) -> None:
    try:
        trio.run(main)
    finally:
        for ours, theirs in pairs:
            ours.close()
            theirs.close()


async def read_into(wires: list[bytes], n: int, theirs: socket.socket, until: bytes) -> None:
    """Client ``n`` reads until ``until`` is in what it got."""
    sock = trio.socket.from_stdlib_socket(theirs)
    while until not in wires[n]:
        data = await sock.recv(1 << 20)
        assert data, wires[n][-200:]
        wires[n] += data


async def jump_then_live(server: Server, message_of: Any) -> None:
    """The sync past the live subscribers, then two live messages."""
    hub = server.ctx.hub
    hub.reposition(SUBJECT, Position(EPOCH, HELD + JUMP), None,
                   [message_of(s) for s in range(1, HELD + JUMP + 1)], trio.current_time())
    server.wake_idle_writes()
    for seq in (HELD + JUMP + 1, LAST):
        await trio.lowlevel.checkpoint()
        hub.apply(message_of(seq), trio.current_time())
        server.wake_idle_writes()


def run(path: Any, tell: Any, monkeypatch: pytest.MonkeyPatch,
        ) -> tuple[list[bytes], int, bytes]:
    """Every client's bytes, the slow consumers counted, the slow client's bytes."""
    monkeypatch.setattr(hub_module, "send_missed", path)
    monkeypatch.setattr(hub_module, "tell_missed", tell)
    # the jump is ~76 kB a client: past ClientMaxPendingBytes for the one whose socket
    # takes ~4 kB, not for those whose socket takes each batch (8 kB) as it fills
    server = Server(Config.from_mapping({"ClientMaxPendingBytes": "32768",
                                         "MaxBatchingSpace": "8192",
                                         "MaxMessageSize": "4096"}))
    hub = server.ctx.hub
    hub.numbered_elsewhere = True
    for seq in range(1, HELD + 1):
        hub.apply(numbered(seq), 0.0)
    hub.apply(numbered(1, OTHER), 0.0)
    requests = [websocket_client(f"c{n}") for n in range(NATIVES)]
    requests += [stream_client([SUBJECT]), stream_client([OTHER, SUBJECT])]
    requests += [mqtt_client(f"d{n}", clean=n > 0) for n in range(DEVICES)]
    requests += [websocket_client("slow")]
    pairs = [socket.socketpair() for _ in requests]
    for ours, _ in pairs:
        ours.setblocking(False)
    slow_ours, slow_theirs = pairs[-1]
    slow_ours.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 4096)
    wires = [b""] * len(pairs)
    state = hub._subjects[SUBJECT]

    async def main() -> None:
        async with serving(server) as nursery:
            for n, ((ours, theirs), request) in enumerate(
                    zip(pairs, requests, strict=True)):
                if NATIVES + 2 <= n < NATIVES + 2 + DEVICES:
                    nursery.start_soon(MqttConnection(server, ours, "127.0.0.1:1",
                                                      OPEN_LISTENER).run)
                else:
                    connection = Connection(server, ours, "127.0.0.1:1", OPEN_LISTENER)
                    server.connections.add(connection)
                    nursery.start_soon(connection.run)
                theirs.sendall(request)
            while (len(state.subscribers) + len(state.formatted) + len(state.listeners)
                   < len(pairs)):
                await trio.sleep(0.01)
            # the slow client reads what came so far, then nothing
            await read_into(wires, len(pairs) - 1, slow_theirs, b"SUBSCRIBE_ALLOW")
            await jump_then_live(server, numbered)
            async with trio.open_nursery() as readers:
                for n, (_, theirs) in enumerate(pairs[:-1]):
                    readers.start_soon(read_into, wires, n, theirs, b"%d:" % LAST)
                # cut off: it gets its close frame (4500) once it reads again
                readers.start_soon(read_into, wires, len(pairs) - 1, slow_theirs,
                                   b"slow consumer")

    run_then_close(main, pairs)
    return wires[:-1], server.ctx.stats.slow_consumers, wires[-1]


def test_the_clients_of_a_jump_get_the_bytes_one_message_at_a_time_gave_them(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    received = []
    for path, tell in ((per_message, told_per_message),
                       (format_sink.send_missed, format_sink.tell_missed)):
        wires, slow_consumers, slow = run(path, tell, monkeypatch)
        assert slow_consumers == 1
        assert b"slow consumer" in slow
        natives = [after_subscribe_frames(wire) for wire in wires[:NATIVES]]
        streams = [after_subscribe_events(wire) for wire in wires[NATIVES:NATIVES + 2]]
        devices = wires[NATIVES + 2:]  # CONNACK, SUBACK, then the PUBLISHes: all of it
        for wire in devices:
            publishes = [p for p in mqtt.MqttDecoder(server=False).events(wire)
                         if isinstance(p, mqtt.Publish)]
            assert [int(p.payload.split(b":")[0]) for p in publishes] == list(
                range(HELD + 1, LAST + 1))
        for frames in natives:
            seqs = [m.seq for f in frames for m in ops.decode_server_op(f).messages]  # type: ignore[union-attr]
            assert seqs == list(range(HELD + 1, LAST + 1))
        for events in streams:
            assert len(events) == LAST - HELD
            assert events[-1].endswith(b"%d\n" % LAST) or b":%d" % LAST in events[-1]
        received.append((natives, streams, devices))
    assert received[0] == received[1]


def guaranteed(seq: int) -> Message:
    return new_message(SUBJECT, b"%d:" % seq + b"y" * (seq % 7 * 40), {}, False,
                       Qos.GUARANTEED, None, EPOCH, seq, MessageType.UPDATE)


def run_qos_1(tell: Any, monkeypatch: pytest.MonkeyPatch) -> list[bytes]:
    """MQTT sessions at QoS 1 (clean, persistent) that send nothing after their
    SUBSCRIBE: what each gets of a jump of guaranteed messages and two live ones."""
    monkeypatch.setattr(hub_module, "tell_missed", tell)
    server = Server(Config.from_mapping({"MaxBatchingSpace": "8192"}))
    hub = server.ctx.hub
    hub.numbered_elsewhere = True
    for seq in range(1, HELD + 1):
        hub.apply(guaranteed(seq), 0.0)
    requests = [encode_packet(mqtt.Connect(f"q{n}", clean_session=n > 0))
                + encode_packet(mqtt.Subscribe(1, ((SUBJECT[1:], 1),))) for n in range(2)]
    pairs = [socket.socketpair() for _ in requests]
    for ours, _ in pairs:
        ours.setblocking(False)
    wires = [b""] * len(pairs)
    state = hub._subjects[SUBJECT]

    async def main() -> None:
        async with serving(server) as nursery:
            for (ours, theirs), request in zip(pairs, requests, strict=True):
                nursery.start_soon(MqttConnection(server, ours, "127.0.0.1:1",
                                                  OPEN_LISTENER).run)
                theirs.sendall(request)
            while len(state.listeners) < len(pairs):
                await trio.sleep(0.01)
            await jump_then_live(server, guaranteed)
            async with trio.open_nursery() as readers:
                for n, (_, theirs) in enumerate(pairs):
                    readers.start_soon(read_into, wires, n, theirs, b"%d:" % LAST)

    run_then_close(main, pairs)
    return wires


def test_qos_1_sessions_get_the_jump_from_their_writers_the_same_bytes(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Their backlog (mqtt_backlog) is sent by their connections' writers, in their
    turns of the loop, though they send nothing: the same bytes -- packet identifiers
    included -- as one message at a time in the hub's step gave them."""
    received = [run_qos_1(tell, monkeypatch)
                for tell in (told_per_message, format_sink.tell_missed)]
    assert received[0] == received[1]
    for wire in received[1]:
        publishes = [p for p in mqtt.MqttDecoder(server=False).events(wire)
                     if isinstance(p, mqtt.Publish)]
        assert [(int(p.payload.split(b":")[0]), p.qos, p.packet_id) for p in publishes] == [
            (seq, 1, n) for n, seq in enumerate(range(HELD + 1, LAST + 1), 1)]
