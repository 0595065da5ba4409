"""The h11-based server side of HTTP/1.1: bytes in, requests out, responses out."""

from __future__ import annotations

from collections.abc import Callable

import h11
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from migratory.protocol.http import HttpError
from migratory.protocol.http_server import (
    ClientClosed,
    HttpEvent,
    HttpServer,
    RequestReceived,
    UpgradeRequested,
)

GET = b"GET /snapshot?subject=/a/b&subject=/c/d HTTP/1.1\r\nHost: x\r\n\r\n"
POST = b'POST /publish HTTP/1.1\r\nHost: x\r\nContent-Length: 16\r\n\r\n{"subject":"/a"}'
UPGRADE = (
    b"GET /chat HTTP/1.1\r\nHost: x\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
    b"Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n\r\n"
)


def events(server: HttpServer) -> list[HttpEvent]:
    out = []
    while (event := server.next_event()) is not None:
        out.append(event)
        if isinstance(event, RequestReceived):
            break
    return out


def whole(server: HttpServer, data: bytes) -> list[HttpEvent]:
    server.receive_data(data)
    return events(server)


def bytewise(server: HttpServer, data: bytes) -> list[HttpEvent]:
    out: list[HttpEvent] = []
    for i in range(len(data)):
        server.receive_data(data[i : i + 1])
        out += events(server)
    return out


FEEDS = [whole, bytewise]
Feed = Callable[[HttpServer, bytes], list[HttpEvent]]


@pytest.mark.parametrize("feed", FEEDS)
def test_get_with_repeated_query_parameters(feed: Feed) -> None:
    [event] = feed(HttpServer(max_body=100), GET)
    assert isinstance(event, RequestReceived)
    assert event.request.path == "/snapshot"
    assert event.request.query_values("subject") == ["/a/b", "/c/d"]
    assert event.request.query["subject"] == "/a/b"


@pytest.mark.parametrize("feed", FEEDS)
def test_post_body_is_delivered_whole(feed: Feed) -> None:
    [event] = feed(HttpServer(max_body=100), POST)
    assert isinstance(event, RequestReceived)
    assert event.request.method == "POST" and event.request.body == b'{"subject":"/a"}'


def test_keep_alive_and_pipelining_answer_in_order() -> None:
    server = HttpServer(max_body=100)
    server.receive_data(GET + POST)  # pipelined: the second waits for the first's response
    first = server.next_event()
    assert isinstance(first, RequestReceived) and first.request.method == "GET"
    assert server.next_event() is None  # not before the response
    response = server.respond(200, b"one")
    assert not server.must_close
    second = server.next_event()
    assert isinstance(second, RequestReceived) and second.request.method == "POST"
    response += server.respond(201, b"two")
    client = h11.Connection(h11.CLIENT)
    client.send(h11.Request(method="GET", target="/", headers=[("Host", "x")]))
    client.send(h11.EndOfMessage())
    client.receive_data(response)
    reply = client.next_event()
    assert isinstance(reply, h11.Response) and reply.status_code == 200
    assert client.next_event() == h11.Data(data=b"one")


def test_http10_and_connection_close_must_close() -> None:
    for head in (
        b"GET / HTTP/1.0\r\n\r\n",
        b"GET / HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n",
    ):
        server = HttpServer(max_body=10)
        [event] = whole(server, head)
        assert isinstance(event, RequestReceived)
        server.respond(200, b"x")
        assert server.must_close


def test_upgrade_keeps_the_bytes_after_it() -> None:
    [event] = whole(HttpServer(max_body=0), UPGRADE + b"\x82\x00frame")
    assert isinstance(event, UpgradeRequested)
    assert event.trailing == b"\x82\x00frame"


def test_client_close_between_requests() -> None:
    server = HttpServer(max_body=0)
    server.receive_data(b"")
    assert isinstance(server.next_event(), ClientClosed)


def test_body_over_the_limit_is_refused_before_it_is_read() -> None:
    server = HttpServer(max_body=10)
    server.receive_data(b"POST /publish HTTP/1.1\r\nHost: x\r\nContent-Length: 11\r\n\r\n")
    with pytest.raises(HttpError) as refused:
        server.next_event()
    assert refused.value.status == 413


def test_chunked_body_over_the_limit_is_refused() -> None:
    server = HttpServer(max_body=10)
    server.receive_data(
        b"POST /publish HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n"
        b"8\r\n12345678\r\n8\r\n12345678\r\n0\r\n\r\n"
    )
    with pytest.raises(HttpError) as refused:
        server.next_event()
    assert refused.value.status == 413


def test_expect_100_continue_is_answered() -> None:
    server = HttpServer(max_body=100)
    server.receive_data(
        b"POST /publish HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\nExpect: 100-continue\r\n\r\n"
    )
    assert server.next_event() is None
    assert server.data_to_send().startswith(b"HTTP/1.1 100 ")


@pytest.mark.parametrize(
    "data",
    [
        b"GET / HTTP/1.1\r\n\r\n",  # no Host
        b"GET / HTTP/1.1\r\nHost: x\r\nBad Header: y\r\n\r\n",
        b"G@T / HTTP/1.1\r\nHost: x\r\n\r\n",
        b"GET / HTTP/1.1\r\nHost: x\r\nContent-Length: 1\r\nContent-Length: 2\r\n\r\n",
        b"GET / HTTP/1.1\r\nHost: x\r\nX: " + b"y" * 20000 + b"\r\n\r\n",
    ],
)
def test_bad_requests_raise_http_error_with_a_status(data: bytes) -> None:
    server = HttpServer(max_body=100)
    with pytest.raises(HttpError) as bad:
        whole(server, data)
    assert 400 <= bad.value.status < 500


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=300), st.lists(st.integers(1, 40), max_size=8))
def test_garbage_only_ever_raises_http_error(garbage: bytes, cuts: list[int]) -> None:
    server = HttpServer(max_body=64, max_head=256)
    data, pieces = GET + garbage, []
    for cut in cuts:
        pieces.append(data[:cut])
        data = data[cut:]
    pieces.append(data)
    try:
        for piece in pieces:
            server.receive_data(piece)
            while (event := server.next_event()) is not None:
                if isinstance(event, RequestReceived):
                    server.respond(200, b"ok")
                elif isinstance(event, (UpgradeRequested, ClientClosed)):
                    return
    except HttpError as exc:
        assert 400 <= exc.status < 600
