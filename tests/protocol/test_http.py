"""Minimal HTTP/1.1: request heads, the WebSocket handshake both ways, responses."""

from __future__ import annotations

import ast
import base64
from collections.abc import Callable
from pathlib import Path

import h11
import pytest
import wsproto
import wsproto.events as wse
from hypothesis import given, settings
from hypothesis import strategies as st

from migratory.protocol import http
from migratory.protocol.http import (
    HttpError,
    Request,
    RequestParser,
    check_handshake_response,
    handshake_request,
    handshake_response,
    new_websocket_key,
    response,
    websocket_accept,
)

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


# --- request parsing ----------------------------------------------------------------------------


@FEEDS
def test_query_and_path_are_percent_decoded(feed: Feed) -> None:
    data = get(
        target="/snap%20shot?subject=%2FStocks%2FNYSE%2FIBM&token=a+b%2B&subject=second&empty="
    )
    request = feed(data, RequestParser())
    assert request is not None
    assert (
        request.target
        == "/snap%20shot?subject=%2FStocks%2FNYSE%2FIBM&token=a+b%2B&subject=second&empty="
    )
    assert request.path == "/snap shot"
    assert request.query == {"subject": "/Stocks/NYSE/IBM", "token": "a b+", "empty": ""}


@FEEDS
def test_headers_lower_cased_and_trimmed(feed: Feed) -> None:
    request = feed(get("X-Thing:   spaced out \t", "X-Empty:", "X-Latin: caf\xe9"), RequestParser())
    assert request is not None
    assert request.headers == (
        ("host", "example.com"),
        ("x-thing", "spaced out"),
        ("x-empty", ""),
        ("x-latin", "café"),
    )
    assert request.header("X-THING") == "spaced out"
    assert request.header("x-missing") is None


@FEEDS
def test_absolute_form_and_leading_blank_lines(feed: Feed) -> None:
    request = feed(b"\r\n\r\n" + get(target="http://example.com/a?b=c"), RequestParser())
    assert request is not None
    assert (request.path, request.query) == ("/a", {"b": "c"})


@FEEDS
def test_http10_needs_no_host(feed: Feed) -> None:
    request = feed(b"GET / HTTP/1.0\r\n\r\n", RequestParser())
    assert request is not None and request.http_version == "1.0"


def test_receive_after_completion_extends_trailing() -> None:
    parser = RequestParser()
    request = parser.receive_data(get() + b"ab")
    assert parser.receive_data(b"cd") is request
    assert parser.trailing == b"abcd"
    assert parser.request is request


REQUEST_ERRORS = {
    "two spaces": (b"GET  / HTTP/1.1\r\nHost: a\r\n\r\n", 400),
    "no version": (b"GET /\r\nHost: a\r\n\r\n", 400),
    "bad version": (b"GET / HTTX/1.1\r\nHost: a\r\n\r\n", 400),
    "HTTP/2": (b"PRI * HTTP/2.0\r\n\r\n", 400),
    "bad method": (b"G(T / HTTP/1.1\r\nHost: a\r\n\r\n", 400),
    "relative target": (b"GET a/b HTTP/1.1\r\nHost: a\r\n\r\n", 400),
    "non-ASCII target": ("GET /é HTTP/1.1\r\nHost: a\r\n\r\n".encode(), 400),
    "bad percent-encoding": (get(target="/?s=%ff"), 400),
    "bad absolute URL": (get(target="http://[::1/"), 400),
    "header without colon": (get("Nonsense"), 400),
    "space before colon": (get("X-A : b"), 400),
    "NUL in value": (get("X-A: b\0"), 400),
    "no Host": (b"GET / HTTP/1.1\r\n\r\n", 400),
    "two Hosts": (get("Host: other"), 400),
    "Content-Length body": (get("Content-Length: 5"), 413),
    "chunked body": (get("Transfer-Encoding: chunked"), 413),
    "POST with body": (get("Content-Length: 5", method="POST"), 413),
    "bad Content-Length": (get("Content-Length: five"), 400),
    "huge Content-Length": (get("Content-Length: " + "9" * 5000), 400),
    "signed Content-Length": (get("Content-Length: +0"), 400),
    "conflicting Content-Length": (get("Content-Length: 0", "Content-Length: 1"), 400),
    "Content-Length and chunked": (get("Content-Length: 0", "Transfer-Encoding: chunked"), 400),
}


@FEEDS
@pytest.mark.parametrize("name", list(REQUEST_ERRORS))
def test_request_errors(feed: Feed, name: str) -> None:
    data, status = REQUEST_ERRORS[name]
    parser = RequestParser()
    with pytest.raises(HttpError) as info:
        feed(data, parser)
    assert info.value.status == status
    with pytest.raises(HttpError) as again:  # and keeps failing
        parser.receive_data(b"\r\n\r\n")
    assert again.value is info.value


def test_empty_body_is_fine() -> None:
    assert parse(get("Content-Length: 0", "Content-Length: 0")).method == "GET"
    assert parse(get("Content-Length: 000")).method == "GET"


@pytest.mark.parametrize("feed", [feed_whole, feed_bytewise], ids=["whole", "bytewise"])
def test_oversize_head_is_refused_without_waiting_for_its_end(feed: Feed) -> None:
    with pytest.raises(HttpError) as info:
        feed(get("X-Big: " + "x" * 200)[:-4], RequestParser(max_header_bytes=100))
    assert info.value.status == 431
    with pytest.raises(HttpError) as info:
        feed(b"GET /" + b"x" * 200, RequestParser(max_header_bytes=100))
    assert info.value.status == 431  # h11 says 431 for a long request line too


def test_a_head_under_the_limit_is_accepted() -> None:
    data = get("X-Pad: " + "x" * 50)
    assert RequestParser(max_header_bytes=len(data)).receive_data(data) is not None
    with pytest.raises(HttpError):
        RequestParser(max_header_bytes=len(data) // 2).receive_data(data)


@pytest.mark.parametrize("data", [get("X-A: b", " folded"), get("X-A: b\nX-B: c")],
                         ids=["obs-fold", "bare LF"])
def test_h11_reads_folded_and_bare_lf_headers_leniently(data: bytes) -> None:
    """h11 (the reference the issue names) unfolds obs-fold and accepts bare LF line
    ends, as RFC 9112 permits a recipient to; the old hand-written parser refused them."""
    assert parse(data).header("x-a") is not None


tokens = st.text("abcdefghijklmnopqrstuvwxyz0123456789-_", min_size=1, max_size=12)
values = st.text(st.characters(min_codepoint=0x21, max_codepoint=0x7E), max_size=30)


@settings(max_examples=200, deadline=None)
@given(
    st.lists(tokens, min_size=1, max_size=4),
    st.dictionaries(tokens, st.text(max_size=10), max_size=4),
    st.lists(st.tuples(tokens.map(lambda t: "x-" + t), values), max_size=6),
    st.lists(st.integers(1, 50), max_size=20),
)
def test_any_request_parses_back_in_any_chunks(
    segments: list[str], query: dict[str, str], headers: list[tuple[str, str]], sizes: list[int]
) -> None:
    from urllib.parse import quote, urlencode

    target = "/" + "/".join(quote(s) for s in segments)
    if query:
        target += "?" + urlencode(query)
    data = get(*(f"{k}: {v}" for k, v in headers), target=target) + FIRST_FRAME
    parser = RequestParser()
    request, i = None, 0
    for size in [*sizes, len(data)]:
        request = parser.receive_data(data[i : i + size]) or request
        i += size
    assert request is not None
    assert request.path == "/" + "/".join(segments)
    assert request.query == query
    assert request.headers[1:] == tuple(headers)
    assert parser.trailing == FIRST_FRAME


@settings(max_examples=300, deadline=None)
@given(st.sampled_from([b"", b"GET / HTTP/1.1\r\n", b"GET /"]), st.binary(max_size=300))
def test_garbage_only_ever_raises_http_error(prefix: bytes, garbage: bytes) -> None:
    try:
        RequestParser(max_header_bytes=200).receive_data(prefix + garbage + b"\r\n\r\n")
    except HttpError as exc:
        assert exc.status in (400, 405, 413, 414, 431, 505)
    try:
        check_handshake_response(prefix + garbage + b"\r\n\r\n", RFC_KEY)
    except HttpError as exc:
        assert 100 <= exc.status <= 999


# --- responses ----------------------------------------------------------------------------------


def test_response_bytes() -> None:
    assert response(200, b"hi", headers=[("X-Extra", "1")]) == (
        b"HTTP/1.1 200 OK\r\n"
        b"Content-Type: text/plain; charset=utf-8\r\n"
        b"Content-Length: 2\r\n"
        b"Connection: close\r\n"
        b"X-Extra: 1\r\n"
        b"\r\n"
        b"hi"
    )
    assert (
        response(404) == b"HTTP/1.1 404 Not Found\r\nContent-Length: 0\r\nConnection: close\r\n\r\n"
    )
    assert response(204) == b"HTTP/1.1 204 No Content\r\nConnection: close\r\n\r\n"


@pytest.mark.parametrize(
    "call",
    [
        lambda: response(200, headers=[("X-Bad", "a\r\nInjected: yes")]),
        lambda: response(200, headers=[("Bad Name", "a")]),
        lambda: response(99),
        lambda: response(204, b"body"),
        lambda: handshake_request("example.com", "no-slash", RFC_KEY),
        lambda: handshake_request("example.com", "/a b", RFC_KEY),
        lambda: handshake_request("example.com\r\nX: y", "/", RFC_KEY),
    ],
)
def test_response_and_request_builders_refuse_injection(call: Callable[[], object]) -> None:
    with pytest.raises(ValueError):
        call()


def test_responses_parse_in_h11() -> None:
    for status, body in [(200, b'{"a": 1}'), (404, b""), (413, b"too big\n")]:
        conn = h11.Connection(h11.CLIENT)
        conn.send(h11.Request(method="GET", target="/", headers=[("Host", "a")]))
        conn.send(h11.EndOfMessage())
        conn.receive_data(response(status, body, content_type="application/json"))
        head = conn.next_event()
        assert isinstance(head, h11.Response) and head.status_code == status
        received = b""
        while not isinstance(event := conn.next_event(), h11.EndOfMessage):
            assert isinstance(event, h11.Data)
            received += event.data
        assert received == body


def test_http_error_encodes_a_response() -> None:
    error = HttpError(405, "only GET is supported", headers=[("Allow", "GET")])
    assert error.encode() == response(405, b"only GET is supported\n", headers=[("Allow", "GET")])
    assert str(error) == "405 only GET is supported"


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


def test_module_does_no_io() -> None:
    imported = set()
    for node in ast.walk(ast.parse(Path(http.__file__).read_text())):
        if isinstance(node, ast.Import):
            imported |= {alias.name.split(".")[0] for alias in node.names}
        elif isinstance(node, ast.ImportFrom):
            imported.add((node.module or "").split(".")[0])
    assert not imported & {"trio", "socket", "asyncio", "selectors", "ssl"}
