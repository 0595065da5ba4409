"""Request parsers, the three ways to feed them, and hand-built requests (the RFC 6455
example among them) for the HTTP and handshake tests."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from migratory.protocol.http import Request
from migratory.protocol.http_server import RequestParser

RFC_KEY = "dGhlIHNhbXBsZSBub25jZQ=="
RFC_ACCEPT = "s3pPLMBiTxaQ9kYGzzhZRbK+xOo="
RFC_REQUEST = (
    b"GET /chat HTTP/1.1\r\n"
    b"Host: server.example.com\r\n"
    b"Upgrade: websocket\r\n"
    b"Connection: Upgrade\r\n"
    b"Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n"
    b"Origin: http://example.com\r\n"
    b"Sec-WebSocket-Protocol: chat, superchat\r\n"
    b"Sec-WebSocket-Version: 13\r\n"
    b"\r\n"
)
FIRST_FRAME = bytes.fromhex("828537fa213d7f9f4d5158")  # pipelined right after the handshake


def feed_whole(data: bytes, parser: RequestParser) -> Request | None:
    request = parser.receive_data(data)
    assert parser.trailing == b""
    return request


def feed_bytewise(data: bytes, parser: RequestParser) -> Request | None:
    for i in range(len(data) - 1):
        assert parser.receive_data(data[i : i + 1]) is None
    return parser.receive_data(data[-1:])


def feed_with_trailing(data: bytes, parser: RequestParser) -> Request | None:
    request = parser.receive_data(data + FIRST_FRAME)
    assert parser.trailing == FIRST_FRAME
    return request


FEEDS = pytest.mark.parametrize(
    "feed", [feed_whole, feed_bytewise, feed_with_trailing], ids=["whole", "bytewise", "trailing"]
)
Feed = Callable[[bytes, RequestParser], "Request | None"]


def parse(data: bytes) -> Request:
    request = RequestParser().receive_data(data)
    assert request is not None
    return request


def get(*headers: str, target: str = "/", method: str = "GET", version: str = "1.1") -> bytes:
    lines = [f"{method} {target} HTTP/{version}", "Host: example.com", *headers, "", ""]
    return "\r\n".join(lines).encode("latin-1")


UPGRADE = (
    "Upgrade: websocket",
    "Connection: Upgrade",
    f"Sec-WebSocket-Key: {RFC_KEY}",
    "Sec-WebSocket-Version: 13",
)
