"""A connection whose operations span several loop turns (connection.py,
OPERATIONS_PER_TURN) and that is aborted between two of them (a write failed) ends
quietly: the reader must not wait on the closed socket (chaos run, seed 3: ValueError
'file descriptor cannot be a negative integer' and BusyResourceError, closed 1011)."""

from __future__ import annotations

import contextlib
import logging
import socket
from typing import Any

import pytest
import trio
import trio.testing

from migratory.config import Config
from migratory.listeners import OPEN_LISTENER
from migratory.model.message import Message
from migratory.protocol import mqtt, ops
from migratory.protocol import websocket as ws
from migratory.protocol.http import handshake_request, new_websocket_key
from migratory.protocol.mqtt_encode import encode_packet
from migratory.server.app import Server, build_hub
from migratory.server.connection import OPERATIONS_PER_TURN, RECV_SIZE, Connection
from migratory.server.context import LocalPublishing
from migratory.server.metric_figures import PublishTimings
from migratory.server.mqtt_connection import MqttConnection


def test_an_abort_between_two_turns_ends_the_reader_quietly(
    caplog: pytest.LogCaptureFixture,
) -> None:
    server = Server(Config.defaults())
    ours, theirs = socket.socketpair()
    ours.setblocking(False)
    connect = ws.encode_masked_binary(ops.encode_client_op(ops.Connect("c")), b"mask")
    pings = ws.encode_masked_binary(ops.encode_client_op(ops.Ping(1)), b"mask")
    theirs.sendall(handshake_request("127.0.0.1", "/", new_websocket_key()) + connect)

    async def main() -> None:
        async with trio.open_nursery() as nursery:
            server._nursery = nursery
            connection = Connection(server, ours, "127.0.0.1:1", OPEN_LISTENER)
            server.connections.add(connection)
            nursery.start_soon(connection.run)
            await trio.sleep(0.05)
            assert connection.session.connected
            read = server.ctx.stats.bytes_read
            theirs.sendall(pings * (OPERATIONS_PER_TURN * 4))  # four turns of work
            with trio.fail_after(2):
                while server.ctx.stats.bytes_read == read:  # the reader took them in
                    await trio.sleep(0)
            connection._abort()  # what a failed write does, between two turns
            with trio.fail_after(2):
                while connection in server.connections or not nursery.child_tasks:
                    await trio.sleep(0.01)
            await trio.sleep(0.1)
            nursery.cancel_scope.cancel()

    with caplog.at_level(logging.INFO):
        trio.run(main)
    theirs.close()
    assert "internal error" not in caplog.text, caplog.text


class HeldPublishing:
    """Publishes wait until the test settles them (a cluster's commit)."""

    def __init__(self, hub: Any) -> None:
        self.local = LocalPublishing(hub)
        self.held: list[tuple[Message, Any]] = []
        self.timings = PublishTimings()

    def submit(self, message: Message, reply: Any, now: float) -> None:
        self.held.append((message, reply))

    def settle(self) -> None:
        held, self.held = self.held, []
        for message, reply in held:
            self.local.submit(message, reply, 0.0)

    def statistics(self) -> dict[str, Any]:
        return {}


def test_a_request_waiting_for_its_answer_holds_the_reading_back() -> None:
    """POST /publish waits for its commit; what the client pipelines behind it stays in
    the kernel (TCP flow control) instead of piling up in the server's HTTP parser, and
    is read and answered, in order, once the publish has its answer."""
    config = Config.defaults()
    hub = build_hub(config)
    held = HeldPublishing(hub)
    server = Server(config, hub=hub, publishing=held)
    ours, theirs = socket.socketpair()
    ours.setblocking(False)
    theirs.setblocking(False)
    body = b'{"subject": "/a/b", "content": "x"}'
    publish = b"POST /publish HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\n\r\n%s" % (
        len(body), body)
    padded = b"GET /healthz HTTP/1.1\r\nHost: x\r\nX-Pad: " + b"p" * 8000 + b"\r\n\r\n"
    pipelined = publish + padded * 128  # 1 MiB behind the publish
    answers = bytearray()

    async def pump(seconds: float) -> int:
        """Send what the kernel takes for ``seconds`` (or until all is sent)."""
        sent = 0
        with trio.move_on_after(seconds):
            while sent < len(pipelined):
                try:
                    sent += theirs.send(pipelined[sent:])
                except BlockingIOError:
                    await trio.sleep(0.01)
                with contextlib.suppress(BlockingIOError):
                    answers.extend(theirs.recv(65536))
        return sent

    async def main() -> None:
        nonlocal pipelined
        async with trio.open_nursery() as nursery:
            server._nursery = nursery
            connection = Connection(server, ours, "127.0.0.1:1", OPEN_LISTENER)
            server.connections.add(connection)
            nursery.start_soon(connection.run)
            sent = await pump(0.3)
            assert len(held.held) == 1  # the publish waits for its commit
            assert sent > 2 * RECV_SIZE  # the kernel took more than one read of it
            assert server.ctx.stats.bytes_read <= RECV_SIZE  # the server read one chunk
            held.settle()
            pipelined = pipelined[sent:]
            await pump(5.0)
            with trio.move_on_after(5):
                while answers.count(b"HTTP/1.1 200 ") < 129:
                    with contextlib.suppress(BlockingIOError):
                        answers.extend(theirs.recv(65536))
                    await trio.sleep(0.01)
            nursery.cancel_scope.cancel()

    trio.run(main)
    theirs.close()
    assert answers.count(b"HTTP/1.1 200 ") == 129
    assert answers.startswith(b"HTTP/1.1 200 ") and b'"PUBLISH_OK"' in answers[:400]



async def mqtt_answers(sock: Any, until: type, count: int = 1) -> list[mqtt.Packet]:
    """What the server sends until its ``count``-th packet of type ``until``, the
    connection's end, or 60 s (the test's clock)."""
    decoder = mqtt.MqttDecoder(server=False)
    got: list[mqtt.Packet] = []
    with trio.move_on_after(60):
        while sum(isinstance(p, until) for p in got) < count:
            data = await sock.recv(1 << 16)
            if not data:
                break
            decoder.receive_data(data)
            while (packet := decoder.next_event()) is not None:
                got.append(packet)
    return got


async def mqtt_client(server: Server, nursery: trio.Nursery, first: bytes) -> tuple[
        Any, MqttConnection]:
    """A client's socket on a new MQTT connection of ``server``, ``first`` sent."""
    ours, theirs = socket.socketpair()
    ours.setblocking(False)
    connection = MqttConnection(server, ours, "127.0.0.1:1", OPEN_LISTENER)
    nursery.start_soon(connection.run)
    sock = trio.socket.from_stdlib_socket(theirs)
    await sock.send(first)
    return sock, connection


def test_a_read_that_outlasts_the_handshake_deadline_is_handled_to_its_end() -> None:
    """A persistent MQTT session comes back with CONNECT and PINGREQ in one read; its
    resume goes a slice per turn of the loop, and HandshakeTimeout passes meanwhile
    (a loaded machine: the mid CI of 0874aa1, 40 sessions resuming at load 15-20). The
    deadline ran over the whole read's steps: it cut them between two turns, the
    PINGREQ left unhandled in the decoder, and the connection went on waiting for bytes
    the client would never send (test_loop_turns_fronts' herd hung to its 60 s guard).
    The deadline is the handshake's: once connected, the read is handled to its end."""
    server = Server(Config.defaults())
    hub = server.ctx.hub
    clock = trio.testing.MockClock(autojump_threshold=0.5)  # still, until jumped
    topics = ("back/a", "back/b")
    missed = 300

    async def main() -> None:
        async with trio.open_nursery() as nursery:
            server._nursery = nursery
            connect = encode_packet(mqtt.Connect("dev", clean_session=False, keep_alive=0))
            sock, _ = await mqtt_client(server, nursery, connect + encode_packet(
                mqtt.Subscribe(1, tuple((t, 0) for t in topics))))
            assert isinstance((await mqtt_answers(sock, mqtt.Suback))[-1], mqtt.Suback)
            await sock.send(encode_packet(mqtt.Disconnect()))
            while await sock.recv(1 << 16):
                pass
            sock.close()
            for n in range(missed):
                for topic in topics:
                    hub.publish(Message("/" + topic, b"%d" % (n + 1)), 0.0)
            sock, back = await mqtt_client(server, nursery, connect + encode_packet(
                mqtt.Pingreq()))
            while not back._unfinished:  # the CONNECT handled, its resume to come
                await trio.sleep(0)
            clock.jump(server.ctx.config.handshake_timeout + 1)
            got = await mqtt_answers(sock, mqtt.Pingresp)
            sock.close()
            nursery.cancel_scope.cancel()
        assert got and isinstance(got[-1], mqtt.Pingresp), got[-3:]
        for topic in topics:
            assert [p.payload for p in got if isinstance(p, mqtt.Publish)
                    and p.topic == topic] == [b"%d" % (n + 1) for n in range(missed)]

    trio.run(main, clock=clock)


def test_a_read_that_outlasts_the_keep_alive_is_handled_to_its_end() -> None:
    """An MQTT client (keep-alive 2 s) sends four turns' worth of PINGREQs in one read,
    and 3 s (1.5 x its keep-alive) pass while the server handles them a step per turn:
    the client was not silent, every PINGREQ is answered. Before, the keep-alive's
    deadline ran over the read's steps: it cut them and closed the connection as
    expired (its PINGRESPs after the cut never sent)."""
    server = Server(Config.defaults())
    clock = trio.testing.MockClock(autojump_threshold=0.5)  # still, until jumped
    pings = OPERATIONS_PER_TURN * 4

    async def main() -> None:
        async with trio.open_nursery() as nursery:
            server._nursery = nursery
            sock, connection = await mqtt_client(server, nursery, encode_packet(
                mqtt.Connect("dev", keep_alive=2)))
            assert isinstance((await mqtt_answers(sock, mqtt.Connack))[-1], mqtt.Connack)
            await sock.send(encode_packet(mqtt.Pingreq()) * pings)
            while not connection._unfinished:  # a step done, the next ones to come
                await trio.sleep(0)
            clock.jump(3.5)
            got = await mqtt_answers(sock, mqtt.Pingresp, pings)
            sock.close()
            nursery.cancel_scope.cancel()
        assert sum(isinstance(p, mqtt.Pingresp) for p in got) == pings

    trio.run(main, clock=clock)
