"""Connections that never finish their handshake (slowloris) cannot lock clients out of
the client ports (migratory/server/limits.py, handshake_slots.py): an in-process server
on loopback sockets, its ``Listen``, ``ListenEncrypted`` (trustme) and ``ListenMqtt``
ports held by idle connections, a stalled TLS ClientHello and a request sent a byte at
a time, while clients connect."""

from __future__ import annotations

import logging
import os
import ssl
from pathlib import Path
from typing import Any

import pytest
import trio
import trustme
from prometheus_client.parser import text_string_to_metric_families
from tls_files import write_tls_files

from migratory.config import load_config
from migratory.protocol import ops
from migratory.protocol import websocket as ws
from migratory.protocol.http import check_handshake_response, handshake_request, new_websocket_key
from migratory.server.app import Server
from migratory.server.limits import RefusalLog

MQTT_CONNECT = bytes([0x10, 16]) + b"\x00\x04MQTT\x04\x02\x00\x3c" + b"\x00\x04good"
STALLED_HELLO = b"\x16\x03\x01\x02\x00"  # a TLS record header, then nothing


async def start(nursery: trio.Nursery, **settings: str) -> Server:
    server = Server(load_config(overrides={"Listen": "127.0.0.1:0", **settings}, environ={}))
    await nursery.start(server.serve)
    return server


def port(server: Server, scheme: str) -> int:
    return next(lst.address[1] for lst in server.listeners if lst.url().startswith(scheme))


async def receive(stream: trio.abc.Stream) -> bytes:
    with trio.fail_after(2):
        return await stream.receive_some(65536)


async def websocket_connected(stream: trio.abc.Stream) -> bool:
    """Upgrade, ``connect``: True once ``connected`` came back."""
    key = new_websocket_key()
    await stream.send_all(handshake_request("127.0.0.1", "/", key))
    buf, used = b"", None
    while used is None:
        chunk = await receive(stream)
        if not chunk:
            return False
        buf += chunk
        used = check_handshake_response(buf, key)  # raises on a 503
    decoder = ws.FrameDecoder(client_frames=False, max_message_size=1 << 20)
    decoder.receive_data(buf[used:])
    await stream.send_all(ws.encode_masked_binary(
        ops.encode_client_op(ops.Connect(client="good")), os.urandom(4)))
    while True:
        event = decoder.next_event()
        if event is None:
            chunk = await receive(stream)
            if not chunk:
                return False
            decoder.receive_data(chunk)
        elif isinstance(event, ws.BinaryMessage):
            return isinstance(ops.decode_server_op(event.data), ops.Connected)


async def mqtt_connected(mqtt_port: int) -> bool:
    stream = await trio.open_tcp_stream("127.0.0.1", mqtt_port)
    async with stream:
        await stream.send_all(MQTT_CONNECT)
        return (await receive(stream))[:4] == b"\x20\x02\x00\x00"  # CONNACK accepted


async def hold(count: int, port: int, first: bytes = b"") -> list[trio.SocketStream]:
    streams = []
    for _ in range(count):
        stream = await trio.open_tcp_stream("127.0.0.1", port)
        if first:
            await stream.send_all(first)
        streams.append(stream)
    return streams


async def closed_by_server(streams: list[trio.SocketStream]) -> int:
    """How many of ``streams`` the server closed (all waited for together, 0.1 s), after
    whatever it said first (an MQTT one closed for room is told CONNACK 3)."""
    closed = []

    async def watch(stream: trio.SocketStream) -> None:
        with trio.move_on_after(0.1):
            try:
                while await stream.receive_some(65536):
                    pass
                closed.append(stream)
            except trio.BrokenResourceError:
                closed.append(stream)

    async with trio.open_nursery() as nursery:
        for stream in streams:
            nursery.start_soon(watch, stream)
    return len(closed)


async def scrape(http_port: int) -> dict[tuple[str, str], float]:
    stream = await trio.open_tcp_stream("127.0.0.1", http_port)
    async with stream:
        await stream.send_all(b"GET /metrics HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        text = b""
        with trio.fail_after(2):
            while chunk := await stream.receive_some(65536):
                text += chunk
    body = text.split(b"\r\n\r\n", 1)[1].decode()
    return {(s.name, s.labels.get("limit", "")): s.value
            for family in text_string_to_metric_families(body) for s in family.samples}


@pytest.fixture
def tls_files(tmp_path: Path) -> dict[str, str]:
    return write_tls_files(trustme.CA(), tmp_path)


def test_a_server_full_of_handshakes_still_takes_clients_on_every_port(
    tls_files: dict[str, str], caplog: Any
) -> None:
    """MaxConnections 30, held by 10 idle connections on each port (a stalled
    ClientHello on the TLS one): each newcomer closes the oldest handshake instead of
    being refused. Before: 503 (and a closed MQTT socket) for every client until the
    strangers' HandshakeTimeout (10 s), for as long as they kept it up."""
    caplog.set_level(logging.WARNING, "migratory.server")
    tls = ssl.create_default_context(cafile=tls_files["ca"])
    trio.run(_full_server, tls_files, tls, caplog)


async def _full_server(tls_files: dict[str, str], tls: ssl.SSLContext, caplog: Any) -> None:
    async with trio.open_nursery() as nursery:
        server = await start(
            nursery, ListenEncrypted="127.0.0.1:0", ListenMqtt="127.0.0.1:0",
            TlsCertificate=tls_files["TlsCertificate"], TlsKey=tls_files["TlsKey"],
            MaxConnections="30", MaxHandshakesPerAddress="0",
        )
        ports = {scheme: port(server, scheme) for scheme in ("ws:", "wss:", "mqtt:")}
        strangers = (await hold(10, ports["ws:"]) + await hold(10, ports["mqtt:"])
                     + await hold(10, ports["wss:"], STALLED_HELLO))
        with trio.fail_after(2):
            while server.admission.pending_handshakes < 30:
                await trio.sleep(0.01)
        plain = await trio.open_tcp_stream("127.0.0.1", ports["ws:"])
        assert await websocket_connected(plain)
        encrypted = trio.SSLStream(await trio.open_tcp_stream("127.0.0.1", ports["wss:"]),
                                   tls, server_hostname="localhost")
        assert await websocket_connected(encrypted)
        assert await mqtt_connected(ports["mqtt:"])
        assert await closed_by_server(strangers) >= 3  # the three oldest went
        refusals = server.ctx.stats.refusals
        assert refusals["MaxConnections"] >= 3 and server.admission.open <= 30
        samples = await scrape(ports["ws:"])  # the scrape's connection is a newcomer too
        assert samples[("migratory_connections_refused_total", "MaxConnections")] >= 3
        assert samples[("migratory_handshakes_pending", "")] >= 26
        lines = [r.getMessage() for r in caplog.records if "MaxConnections" in r.getMessage()]
        assert len(lines) == 1, lines  # one line a minute per kind
        assert "the oldest still in its handshake closed" in lines[0]
        for stream in [*strangers, plain, encrypted]:
            await stream.aclose()
        nursery.cancel_scope.cancel()


def test_a_listener_keeps_at_most_max_pending_handshakes() -> None:
    """MaxPendingHandshakes 10 on a port 15 idle connections reach: the 5 oldest are
    closed at once (not after HandshakeTimeout), a client still connects. Before: the
    key did not exist; the 15 stayed for the 10 s of HandshakeTimeout."""
    trio.run(_listener_bound)


async def _listener_bound() -> None:
    async with trio.open_nursery() as nursery:
        server = await start(nursery, MaxPendingHandshakes="10", MaxHandshakesPerAddress="0")
        plain = port(server, "ws:")
        strangers = await hold(15, plain)
        with trio.fail_after(2):
            while server.ctx.stats.refusals.get("MaxPendingHandshakes", 0) < 5:
                await trio.sleep(0.01)
        assert await closed_by_server(strangers[:5]) == 5
        assert await closed_by_server(strangers[5:]) == 0
        assert server.admission.pending_handshakes == 10
        stream = await trio.open_tcp_stream("127.0.0.1", plain)
        assert await websocket_connected(stream)  # closes strangers[5], the oldest left
        assert server.admission.pending_handshakes == 9  # its handshake is done
        for held in [*strangers, stream]:
            await held.aclose()
        nursery.cancel_scope.cancel()


def test_a_request_sent_a_byte_at_a_time_gets_one_handshake_deadline() -> None:
    """HandshakeTimeout is for the whole handshake: bytes that keep coming do not
    extend it. The connection is closed after it and counted (HandshakeTimeout). Before:
    closed as well, but not counted anywhere."""
    trio.run(_drip)


async def _drip() -> None:
    async with trio.open_nursery() as nursery:
        server = await start(nursery, HandshakeTimeout="1")
        stream = await trio.open_tcp_stream("127.0.0.1", port(server, "ws:"))
        request = b"GET /healthz HTTP/1.1\r\nHost: x\r\nX-Slow: " + b"a" * 100
        sent = 0
        with trio.fail_after(2.5):
            for byte in request:  # 100 ms apart: 12 s for all of it
                try:
                    await stream.send_all(bytes([byte]))
                except trio.BrokenResourceError:
                    break
                sent += 1
                with trio.move_on_after(0.1):
                    try:
                        if not await stream.receive_some(100):
                            break
                    except trio.BrokenResourceError:  # closed with our byte unread: RST
                        break
        assert 5 <= sent <= 15, sent
        assert server.ctx.stats.refusals == {"HandshakeTimeout": 1}
        await stream.aclose()
        nursery.cancel_scope.cancel()


def test_idle_keep_alive_connections_make_room_for_clients_too() -> None:
    """One address fills MaxConnections with HTTP keep-alive connections, each with a
    request answered and then idle (one request per HandshakeTimeout keeps one forever,
    and MaxHandshakesPerAddress no longer counts it): a newcomer closes the oldest idle
    one, as it would a handshake (test_limits.py: never one whose request waits for its
    answer). Before: the newcomer was answered 503."""
    trio.run(_keep_alive)


async def _keep_alive() -> None:
    async with trio.open_nursery() as nursery:
        server = await start(nursery, MaxConnections="10")
        plain = port(server, "ws:")
        idle = await hold(10, plain, b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
        for stream in idle:
            assert (await receive(stream)).startswith(b"HTTP/1.1 200 ")
        assert server.admission.open == 10
        stream = await trio.open_tcp_stream("127.0.0.1", plain)
        assert await websocket_connected(stream)
        assert server.ctx.stats.refusals == {"MaxConnections": 1}
        assert await closed_by_server(idle[:1]) == 1  # the oldest
        assert await closed_by_server(idle[1:]) == 0
        for held in [*idle, stream]:
            await held.aclose()
        nursery.cancel_scope.cancel()


def test_refusals_are_logged_once_per_kind_and_interval() -> None:
    log = RefusalLog(every=60.0)
    assert log.line("MaxConnections", 0.0) == 0
    assert [log.line("MaxConnections", t) for t in (1.0, 2.0, 59.0)] == [None] * 3
    assert log.line("HandshakeTimeout", 3.0) == 0  # another kind: its own line
    assert log.line("MaxConnections", 60.0) == 3  # the three not logged
    assert log.line("MaxConnections", 61.0) is None


def test_an_mqtt_client_that_never_completes_connect_is_counted_and_logged(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """On a ``ListenMqtt`` port nothing, or half a CONNECT, and over MQTT-over-WebSocket
    an upgrade with no CONNECT after it: each closed after HandshakeTimeout, counted
    (``HandshakeTimeout``) and logged as the other refusals (docs/monitoring.md)."""
    caplog.set_level(logging.WARNING, "migratory.server")
    trio.run(_mqtt_silent)
    assert "no handshake within 1 s (HandshakeTimeout)" in caplog.text


async def _mqtt_silent() -> None:
    async with trio.open_nursery() as nursery:
        server = await start(nursery, ListenMqtt="127.0.0.1:0", HandshakeTimeout="1")
        silent = await trio.open_tcp_stream("127.0.0.1", port(server, "mqtt:"))
        half = await trio.open_tcp_stream("127.0.0.1", port(server, "mqtt:"))
        await half.send_all(MQTT_CONNECT[:7])
        upgraded = await trio.open_tcp_stream("127.0.0.1", port(server, "ws:"))
        key = new_websocket_key()
        await upgraded.send_all(handshake_request("127.0.0.1", "/mqtt", key, subprotocol="mqtt"))
        assert b"Sec-WebSocket-Protocol: mqtt" in await receive(upgraded)
        for stream in (silent, half, upgraded):
            with trio.fail_after(5):
                while True:
                    try:
                        if not await stream.receive_some(1000):
                            break
                    except trio.BrokenResourceError:
                        break
            await stream.aclose()
        assert server.ctx.stats.refusals == {"HandshakeTimeout": 3}
        nursery.cancel_scope.cancel()


def test_a_keep_alive_connection_whose_answers_are_being_written_is_not_closed_for_room(
) -> None:
    """The oldest of MaxConnections keep-alive connections pipelined requests whose
    answers its client has not read yet (they wait in its outbox): a newcomer closes the
    next one, idle, not that one. Before: it was closed -- only a request waiting for its
    answer counted as busy -- and its client lost the answers not written yet."""
    trio.run(_answers_being_written)


async def _answers_being_written() -> None:
    requests = 1_000  # 81 kB of answers, of which the kernel takes ~16 kB (SO_SNDBUF)
    async with trio.open_nursery() as nursery:
        server = await start(nursery, MaxConnections="10")
        plain = port(server, "ws:")
        reader = trio.socket.socket()
        reader.setsockopt(trio.socket.SOL_SOCKET, trio.socket.SO_RCVBUF, 4096)
        await reader.connect(("127.0.0.1", plain))
        slow = trio.SocketStream(reader)
        with trio.fail_after(10):  # accepted
            while not server.connections:
                await trio.sleep(0.01)
        (connection,) = server.connections
        # the server's socket buffer is a few kB, not the kernel's autotuned megabytes:
        # answers wait in the outbox however fast the server reads (autotuned, it took
        # ~3.0 MB, 37,000 of the 40,000 answers an earlier version asked for: the rest came
        # 5-17 s after the requests had gone at load 10-20, and CI found none in 5 s)
        connection.sock.setsockopt(trio.socket.SOL_SOCKET, trio.socket.SO_SNDBUF, 4096)
        await slow.send_all(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n" * requests)
        with trio.fail_after(30):  # every request answered
            while connection.session.requests_answered < requests:
                await trio.sleep(0.01)
        assert connection.session.outbox.pending_bytes > 60_000  # waiting to be written
        idle = await hold(9, plain, b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
        for stream in idle:
            assert (await receive(stream)).startswith(b"HTTP/1.1 200 ")
        stream = await trio.open_tcp_stream("127.0.0.1", plain)
        assert await websocket_connected(stream)
        assert server.ctx.stats.refusals == {"MaxConnections": 1}
        assert await closed_by_server(idle) == 1  # the oldest idle one
        answers = await read_answers(slow, requests)
        assert answers == requests, f"closed after {answers} answers"
        for held in [*idle, stream, slow]:
            await held.aclose()
        nursery.cancel_scope.cancel()


async def read_answers(stream: trio.SocketStream, expected: int) -> int:
    """Read 200 answers until ``expected`` came, or the server closed: how many came."""
    got, tail = 0, b""
    with trio.fail_after(10):
        while got < expected:
            chunk = await stream.receive_some(65536)
            if not chunk:
                break
            data = tail + chunk
            got += data.count(b"HTTP/1.1 200 ")
            tail = data[-12:]  # (an answer's status line split between two chunks)
    return got


def test_a_request_that_came_in_time_is_not_cut_while_it_waits_for_the_loop() -> None:
    """A whole request arrives well within HandshakeTimeout, then waits in the loop's
    queue (loop_turns.py: a busy turn, held here until the deadline has passed): it is
    answered, not cut and counted as a HandshakeTimeout. Before: the deadline also ran
    over the wait in the queue -- test_connection_churn.py's clients that had closed
    were counted refused (20-60 a run under load)."""
    trio.run(_queued_past_deadline)


async def _queued_past_deadline() -> None:
    async with trio.open_nursery() as nursery:
        server = await start(nursery, HandshakeTimeout="1")
        budget = server.turns.budget
        per_turn, budget.per_turn = budget.per_turn, 0  # no turn lets a newcomer in
        stream = await trio.open_tcp_stream("127.0.0.1", port(server, "ws:"))
        await stream.send_all(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
        with trio.fail_after(5):
            while not budget.queued:
                await trio.sleep(0.01)
        await trio.sleep(1.5)  # past the deadline, the request still queued
        assert budget.queued == 1
        budget.per_turn = per_turn
        assert (await receive(stream)).startswith(b"HTTP/1.1 200 ")
        assert server.ctx.stats.refusals == {}
        await stream.aclose()
        nursery.cancel_scope.cancel()
