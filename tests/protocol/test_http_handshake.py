"""The WebSocket handshake both ways (migratory/protocol/http.py): the server's answer
to an upgrade (RFC 6455) and the client's request and its check of the reply."""

from __future__ import annotations

import base64

import pytest
import wsproto
import wsproto.events as wse
from http_feeds import (
    FEEDS,
    FIRST_FRAME,
    RFC_ACCEPT,
    RFC_KEY,
    RFC_REQUEST,
    UPGRADE,
    Feed,
    get,
    parse,
)

from migratory.protocol.http import (
    HttpError,
    check_handshake_response,
    handshake_request,
    handshake_response,
    new_websocket_key,
    response,
    websocket_accept,
)
from migratory.protocol.http_server import RequestParser

# --- the RFC 6455 handshake -------------------------------------------------------------------


def test_rfc_accept_value() -> None:
    assert websocket_accept(RFC_KEY) == RFC_ACCEPT


@FEEDS
def test_rfc_handshake(feed: Feed) -> None:
    request = feed(RFC_REQUEST, RequestParser())
    assert request is not None
    assert (request.method, request.target, request.path, request.query) == (
        "GET",
        "/chat",
        "/chat",
        {},
    )
    assert request.header("Sec-WebSocket-Key") == RFC_KEY
    assert request.is_websocket_upgrade
    assert request.websocket_upgrade_error() is None
    assert handshake_response(request) == (
        b"HTTP/1.1 101 Switching Protocols\r\n"
        b"Upgrade: websocket\r\n"
        b"Connection: Upgrade\r\n"
        b"Sec-WebSocket-Accept: s3pPLMBiTxaQ9kYGzzhZRbK+xOo=\r\n"
        b"\r\n"
    )


def test_handshake_echoes_only_our_subprotocol() -> None:
    request = parse(get(*UPGRADE, "Sec-WebSocket-Protocol: chat, migratory.cbor"))
    assert b"Sec-WebSocket-Protocol: migratory.cbor\r\n" in handshake_response(request)
    request = parse(get(*UPGRADE, "Sec-WebSocket-Extensions: permessage-deflate"))
    reply = handshake_response(request)
    assert b"Sec-WebSocket-Protocol" not in reply and b"Extensions" not in reply


def test_upgrade_headers_are_case_and_list_insensitive() -> None:
    request = parse(
        get(
            "upgrade: WebSocket",
            "Connection: keep-alive",
            "CONNECTION: Upgrade",
            f"sec-websocket-key: {RFC_KEY}",
            "Sec-Websocket-Version: 13",
        )
    )
    assert request.header("connection") == "keep-alive, Upgrade"
    assert request.is_websocket_upgrade


UPGRADE_ERRORS = {
    "POST": (get(*UPGRADE, method="POST"), 405, "GET"),
    "HTTP/1.0": (get(*UPGRADE, version="1.0"), 400, "HTTP/1.1"),
    "no Upgrade": (get(*UPGRADE[1:]), 400, "Upgrade header must be 'websocket'"),
    "Upgrade: h2c": (get("Upgrade: h2c", *UPGRADE[1:]), 400, "Upgrade header"),
    "no Connection upgrade": (
        get(UPGRADE[0], "Connection: keep-alive", *UPGRADE[2:]),
        400,
        "Connection",
    ),
    "version 8": (
        get(*UPGRADE[:3], "Sec-WebSocket-Version: 8"),
        426,
        "Sec-WebSocket-Version must be 13",
    ),
    "no version": (get(*UPGRADE[:3]), 426, "Sec-WebSocket-Version must be 13"),
    "no key": (get(*UPGRADE[:2], UPGRADE[3]), 400, "Sec-WebSocket-Key header is missing"),
    "short key": (
        get(*UPGRADE[:2], "Sec-WebSocket-Key: " + base64.b64encode(b"x" * 15).decode(), UPGRADE[3]),
        400,
        "16 bytes",
    ),
    "key not base64": (get(*UPGRADE[:2], "Sec-WebSocket-Key: !!!!", UPGRADE[3]), 400, "16 bytes"),
    "two keys": (get(*UPGRADE, f"Sec-WebSocket-Key: {RFC_KEY}"), 400, "16 bytes"),
}


@pytest.mark.parametrize("name", list(UPGRADE_ERRORS))
def test_bad_upgrade_says_what_is_wrong(name: str) -> None:
    data, status, words = UPGRADE_ERRORS[name]
    request = parse(data)
    assert not request.is_websocket_upgrade
    error = request.websocket_upgrade_error()
    assert error is not None
    assert error.status == status and words in error.reason
    with pytest.raises(HttpError) as info:
        handshake_response(request)
    assert info.value.status == status


def test_version_error_tells_the_client_which_version() -> None:
    error = parse(get(*UPGRADE[:3], "Sec-WebSocket-Version: 8")).websocket_upgrade_error()
    assert error is not None
    assert ("Sec-WebSocket-Version", "13") in error.headers
    assert b"\r\nSec-WebSocket-Version: 13\r\n" in error.encode()
    assert error.encode().startswith(b"HTTP/1.1 426 Upgrade Required\r\n")


def test_plain_get_is_not_an_upgrade() -> None:
    request = parse(get(target="/snapshot?subject=/a/b"))
    assert not request.is_websocket_upgrade
    assert request.websocket_upgrade_error() is None
    with pytest.raises(HttpError) as info:
        handshake_response(request)
    assert info.value.status == 426


# --- the client side of the handshake ---------------------------------------------------------


def server_reply(key: str, *extra: str, status: str = "101 Switching Protocols") -> bytes:
    lines = [
        f"HTTP/1.1 {status}",
        "Upgrade: websocket",
        "Connection: Upgrade",
        f"Sec-WebSocket-Accept: {websocket_accept(key)}",
        *extra,
        "",
        "",
    ]
    return "\r\n".join(lines).encode()


def test_handshake_request_round_trip() -> None:
    key = new_websocket_key()
    assert len(base64.b64decode(key)) == 16
    data = handshake_request("example.com:8800", "/?x=1", key)
    request = parse(data)
    assert request.is_websocket_upgrade
    assert request.header("host") == "example.com:8800"
    assert request.header("sec-websocket-protocol") == "migratory.cbor"
    reply = handshake_response(request)
    assert check_handshake_response(reply, key) == len(reply)
    plain = parse(handshake_request("h", "/", key, subprotocol=None))
    assert plain.header("sec-websocket-protocol") is None


def test_check_handshake_response_three_ways() -> None:
    reply = server_reply(RFC_KEY, "Sec-WebSocket-Protocol: migratory.cbor")
    assert check_handshake_response(reply, RFC_KEY) == len(reply)
    for i in range(len(reply)):
        assert check_handshake_response(reply[:i], RFC_KEY) is None
    assert check_handshake_response(bytearray(reply + FIRST_FRAME), RFC_KEY) == len(reply)


@pytest.mark.parametrize(
    ("reply", "status"),
    [
        (server_reply("wrong key======"), 502),
        (server_reply(RFC_KEY, "Sec-WebSocket-Extensions: permessage-deflate"), 502),
        (server_reply(RFC_KEY, "Sec-WebSocket-Protocol: chat"), 502),
        (server_reply(RFC_KEY).replace(b"Upgrade: websocket", b"Upgrade: h2c"), 502),
        (server_reply(RFC_KEY).replace(b"Connection: Upgrade", b"Connection: close"), 502),
        (server_reply(RFC_KEY, "Bad header"), 502),
        (b"HTTP/1.1 whatever\r\n\r\n", 502),
        (response(403, b"denied"), 403),
        (b"HTTP/1.1 200 OK" + b"x" * 20000, 502),
    ],
)
def test_bad_handshake_responses(reply: bytes, status: int) -> None:
    with pytest.raises(HttpError) as info:
        check_handshake_response(reply, RFC_KEY)
    assert info.value.status == status


def test_wsproto_server_accepts_our_request_and_we_accept_its_reply() -> None:
    key = new_websocket_key()
    conn = wsproto.WSConnection(wsproto.ConnectionType.SERVER)
    conn.receive_data(handshake_request("example.com", "/path?q=1", key))
    (request,) = conn.events()
    assert isinstance(request, wse.Request) and request.target == "/path?q=1"
    reply = conn.send(wse.AcceptConnection(subprotocol="migratory.cbor"))
    assert check_handshake_response(reply, key) == len(reply)
    refused = wsproto.WSConnection(wsproto.ConnectionType.SERVER)
    refused.receive_data(handshake_request("example.com", "/", key))
    list(refused.events())
    with pytest.raises(HttpError) as info:
        check_handshake_response(refused.send(wse.RejectConnection(status_code=403)), key)
    assert info.value.status == 403
