"""Minimal HTTP/1.1: request heads and responses (the WebSocket handshake both ways:
test_http_handshake.py)."""

from __future__ import annotations

import ast
from collections.abc import Callable
from pathlib import Path

import h11
import pytest
from http_feeds import FEEDS, FIRST_FRAME, RFC_KEY, Feed, feed_bytewise, feed_whole, get, parse
from hypothesis import given, settings
from hypothesis import strategies as st

from migratory.protocol import http
from migratory.protocol.http import (
    HttpError,
    check_handshake_response,
    handshake_request,
    response,
)
from migratory.protocol.http_server import RequestParser

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
    assert info.value.reason == "request head larger than 100 bytes"


@FEEDS
@pytest.mark.parametrize("head", [
    b"GARBAGE<script>\r\n\r\n",
    b"GET / HTTP/1.1\r\nHost: x\r\nX-A: \x00<script>\r\n\r\n",
    b"GET / HTTP/1.1\r\nHost: x\r\nBad Name<script>: 1\r\n\r\n",
])
def test_a_refusal_does_not_echo_the_clients_bytes(feed: Feed, head: bytes) -> None:
    """Before: h11's words went out as the 400's body, with the client's bytes in a
    Python repr: ``illegal request line: bytearray(b'GARBAGE<script>')``."""
    with pytest.raises(HttpError) as info:
        feed(head, RequestParser())
    assert info.value.status == 400
    assert "bytearray" not in info.value.reason and "script" not in info.value.reason, (
        info.value.reason)
    assert info.value.reason in ("illegal request line", "illegal header line",
                                 "malformed header line", "invalid character in header value")


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


def test_module_does_no_io() -> None:
    imported = set()
    for node in ast.walk(ast.parse(Path(http.__file__).read_text())):
        if isinstance(node, ast.Import):
            imported |= {alias.name.split(".")[0] for alias in node.names}
        elif isinstance(node, ast.ImportFrom):
            imported.add((node.module or "").split(".")[0])
    assert not imported & {"trio", "socket", "asyncio", "selectors", "ssl"}
