"""The keep-alive deadline of an HTTP connection (migratory/server/connection.py):
``HandshakeTimeout`` seconds with no complete request and none of its answers' bytes
taken by the client close it (docs/http.md). An in-process server on loopback sockets,
trio's MockClock jumping over the client's pauses."""

from __future__ import annotations

import json

import pytest
import trio
import trio.testing

from migratory.config import load_config
from migratory.server.app import Server
from migratory.server.uring_writer import UringUnavailable, UringWriter

TIMEOUT = 2  # HandshakeTimeout, virtual seconds
SNAPSHOTS = 30  # pipelined GET /snapshot of a 900 kB message: 27 MB of answers
SETTINGS = {"Listen": "127.0.0.1:0", "HandshakeTimeout": str(TIMEOUT),
            "MaxMessageSize": "1000000", "MaxFrameSize": "2000000",
            "ClientMaxPendingBytes": "64000000"}
SNAPSHOT_REQUEST = b"GET /snapshot?subject=/Keep/Alive HTTP/1.1\r\nHost: x\r\n\r\n"


def send_path(name: str) -> str:
    if name == "io_uring":
        try:
            UringWriter.open().close()
        except UringUnavailable as exc:
            pytest.skip(f"io_uring not available here: {exc}")
    return name


async def serving(nursery: trio.Nursery, path: str = "socket") -> tuple[Server, int]:
    """A server holding a retained 900 kB message on /Keep/Alive, and its port."""
    server = Server(load_config(overrides={**SETTINGS, "SendPath": path}, environ={}))
    await nursery.start(server.serve)
    port = server.listeners[0].address[1]
    body = json.dumps({"subject": "/Keep/Alive", "content": "x" * 900_000,
                       "retained": True}).encode()
    async with await trio.open_tcp_stream("127.0.0.1", port) as stream:
        await stream.send_all(b"POST /publish HTTP/1.1\r\nHost: x\r\nConnection: close\r\n"
                              b"Content-Length: %d\r\n\r\n" % len(body) + body)
        assert (await stream.receive_some(65536)).startswith(b"HTTP/1.1 200 ")
    return server, port


async def read_until_closed(stream: trio.SocketStream, pause: float) -> bytes:
    """Everything until the server closes (within 60 virtual seconds), ``pause``
    (virtual) seconds between reads."""
    data = bytearray()
    with trio.fail_after(60):
        try:
            while chunk := await stream.receive_some(65536):
                data += chunk
                await trio.sleep(pause)
        except trio.BrokenResourceError:  # closed with unread bytes: a reset
            pass
    return bytes(data)


@pytest.mark.parametrize("path", ["socket", "io_uring"])
def test_answers_a_client_is_still_reading_are_not_cut_by_the_keep_alive_deadline(
    path: str,
) -> None:
    """30 pipelined snapshots (27 MB, answered at once into the outbox) read 64 kB per
    10 ms: 4 s of reading, twice HandshakeTimeout, the socket taking bytes all along:
    every answer arrives whole, then the connection closes, idle. Before: the deadline
    ran from the last answer *queued*, and the connection was aborted 2 s into the
    reading, the answers still queued dropped (14 of 30, the last cut). Either send path
    (SendPath): the client's progress is what its kernel acknowledged, not writability."""
    path = send_path(path)

    async def main() -> None:
        async with trio.open_nursery() as nursery:
            _server, port = await serving(nursery, path)
            stream = await trio.open_tcp_stream("127.0.0.1", port)
            await stream.send_all(SNAPSHOT_REQUEST * SNAPSHOTS)
            asked = trio.current_time()
            data = await read_until_closed(stream, 0.01)
            assert data.count(b"HTTP/1.1 200 ") == SNAPSHOTS
            assert len(data) > SNAPSHOTS * 900_000 and data.endswith(b"x" * 1000)
            assert trio.current_time() - asked > 2 * TIMEOUT  # the case at hand
            await stream.aclose()
            nursery.cancel_scope.cancel()

    trio.run(main, clock=trio.testing.MockClock(autojump_threshold=0))


def test_a_client_that_stops_reading_its_answers_is_closed_after_the_deadline() -> None:
    """The same answers, a client that reads nothing more for 3 x HandshakeTimeout: the
    connection is closed (the bound holds; attack test: holds before too)."""

    async def main() -> None:
        async with trio.open_nursery() as nursery:
            _server, port = await serving(nursery)
            stream = await trio.open_tcp_stream("127.0.0.1", port)
            await stream.send_all(SNAPSHOT_REQUEST * SNAPSHOTS)
            await trio.sleep(3 * TIMEOUT)
            data = await read_until_closed(stream, 0)
            assert data.count(b"HTTP/1.1 200 ") < SNAPSHOTS
            await stream.aclose()
            nursery.cancel_scope.cancel()

    trio.run(main, clock=trio.testing.MockClock(autojump_threshold=0))
