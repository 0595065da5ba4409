"""HTTP/1.1 pieces, sans-I/O: the request, the WebSocket handshake, error responses.

Requests are parsed by h11 (:mod:`migratory.protocol.http_server`, which builds
on this module); this module holds what h11 does not: the :class:`Request` with
its decoded path and query, the WebSocket opening handshake (both sides), and
complete ``Connection: close`` responses for errors.

Errors are :class:`HttpError` carrying the status to answer with;
:meth:`HttpError.encode` gives the complete response.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import os
import re
from collections.abc import Sequence
from dataclasses import dataclass
from http import HTTPStatus
from urllib.parse import parse_qsl, unquote, urlsplit

__all__ = [
    "SUBPROTOCOL",
    "WEBSOCKET_GUID",
    "HttpError",
    "Request",
    "check_handshake_response",
    "handshake_request",
    "handshake_response",
    "new_websocket_key",
    "request_from_head",
    "response",
    "websocket_accept",
]

SUBPROTOCOL = "migratory.cbor"
WEBSOCKET_GUID = "258EAFA5-E914-47DA-95CA-C5AB0DC85B11"
_MAX_RESPONSE_HEAD = 16384

_TOKEN = re.compile(rb"[!#$%&'*+\-.^_`|~0-9A-Za-z]+")
_TARGET = re.compile(rb"[\x21-\x7e]+")
_VERSION = re.compile(rb"HTTP/(\d)\.(\d)")
# A field value: visible ASCII, obs-text, spaces and tabs; no CR, LF, NUL or other controls.
_FIELD_VALUE = re.compile(rb"[\t\x20-\x7e\x80-\xff]*")
_STATUS_LINE = re.compile(rb"HTTP/1\.[01] (\d{3})(?: [^\r\n]*)?")


class HttpError(Exception):
    """A request (or handshake response) we must refuse; answer with ``status``.

    ``headers`` are extra response headers the status calls for (``Allow`` with
    405, ``Sec-WebSocket-Version`` with 426).
    """

    def __init__(
        self, status: int, reason: str, *, headers: Sequence[tuple[str, str]] = ()
    ) -> None:
        super().__init__(f"{status} {reason}")
        self.status = status
        self.reason = reason
        self.headers = tuple(headers)

    def encode(self) -> bytes:
        """The complete HTTP response for this error, the reason as its body."""
        return response(self.status, self.reason.encode("utf-8") + b"\n", headers=self.headers)


@dataclass(frozen=True, slots=True)
class Request:
    """One request head. ``path`` and ``query`` are percent-decoded; header names lower-case."""

    method: str
    target: str
    path: str
    query: dict[str, str]
    headers: tuple[tuple[str, str], ...]
    http_version: str = "1.1"
    body: bytes = b""
    params: tuple[tuple[str, str], ...] = ()  # every query parameter, in order

    def query_values(self, name: str) -> list[str]:
        """Every value of query parameter ``name`` (``?subject=a&subject=b``)."""
        return [value for key, value in self.params if key == name]

    def header(self, name: str) -> str | None:
        """The value of header ``name``; repeated headers joined with ``", "``."""
        name = name.lower()
        values = [value for key, value in self.headers if key == name]
        return ", ".join(values) if values else None

    def _tokens(self, name: str) -> list[str]:
        value = self.header(name)
        if value is None:
            return []
        return [token.strip().lower() for token in value.split(",") if token.strip()]

    @property
    def is_websocket_upgrade(self) -> bool:
        """Whether this is a complete, valid WebSocket opening handshake (RFC 6455 §4.2.1)."""
        return _claims_upgrade(self) and self.websocket_upgrade_error() is None

    def websocket_upgrade_error(self) -> HttpError | None:
        """What is wrong with this request as a WebSocket handshake; None if nothing is.

        Also None for a request that does not try to be one (no ``Upgrade:
        websocket``, no ``Sec-WebSocket-*`` header).
        """
        if not _claims_upgrade(self):
            return None
        if self.method != "GET":
            return HttpError(405, "a WebSocket handshake must be a GET", headers=[("Allow", "GET")])
        if self.http_version != "1.1":
            return HttpError(400, "a WebSocket handshake needs HTTP/1.1")
        if "websocket" not in self._tokens("upgrade"):
            return HttpError(400, "Upgrade header must be 'websocket'")
        if "upgrade" not in self._tokens("connection"):
            return HttpError(400, "Connection header must contain 'upgrade'")
        if self.header("sec-websocket-version") != "13":
            return HttpError(
                426,
                "Sec-WebSocket-Version must be 13",
                headers=[("Sec-WebSocket-Version", "13"), ("Upgrade", "websocket")],
            )
        key = self.header("sec-websocket-key")
        if key is None:
            return HttpError(400, "Sec-WebSocket-Key header is missing")
        if not _is_valid_key(key):
            return HttpError(400, "Sec-WebSocket-Key must be the base64 of 16 bytes")
        return None


def _claims_upgrade(request: Request) -> bool:
    return "websocket" in request._tokens("upgrade") or any(
        name.startswith("sec-websocket-") for name, _ in request.headers
    )


def _is_valid_key(key: str) -> bool:
    try:
        return len(base64.b64decode(key.encode("ascii"), validate=True)) == 16
    except (binascii.Error, UnicodeEncodeError):
        return False


def request_from_head(
    method: str, target: str, headers: Sequence[tuple[str, str]], http_version: str
) -> Request:
    """A :class:`Request` from a parsed head (h11's); header names lower-cased."""
    path, query, params = _split_target(method, target)
    lowered = tuple((name.lower(), value) for name, value in headers)
    return Request(method, target, path, query, lowered, http_version, params=params)


def _parse_header_line(line: bytes) -> tuple[str, str]:
    name, colon, value = line.partition(b":")
    if not colon or not _TOKEN.fullmatch(name):
        # Also a line folded onto the previous one (obs-fold), or space before the colon.
        raise HttpError(400, "malformed header line")
    value = value.strip(b" \t")
    if not _FIELD_VALUE.fullmatch(value):
        raise HttpError(400, "invalid character in header value")
    return name.decode("ascii").lower(), value.decode("latin-1")


def _split_target(
    method: str, target: str
) -> tuple[str, dict[str, str], tuple[tuple[str, str], ...]]:
    if target == "*" and method == "OPTIONS":
        return "*", {}, ()
    try:
        if target.startswith("/"):
            raw_path, _, raw_query = target.partition("?")
        elif "://" in target:  # absolute-form
            parts = urlsplit(target)
            raw_path, raw_query = parts.path or "/", parts.query
        else:
            raise HttpError(400, "malformed request target")
        path = unquote(raw_path, errors="strict")
        params = tuple(parse_qsl(raw_query, keep_blank_values=True, errors="strict"))
        query: dict[str, str] = {}
        for key, value in params:
            query.setdefault(key, value)
    except ValueError:  # also UnicodeDecodeError, and urlsplit's bad IPv6 literal
        raise HttpError(400, "request target is not a valid percent-encoded UTF-8 URL") from None
    return path, query, params


# --- responses ----------------------------------------------------------------


def _reason_phrase(status: int) -> str:
    try:
        return HTTPStatus(status).phrase
    except ValueError:
        return ""


def _header_lines(headers: Sequence[tuple[str, str]]) -> list[str]:
    lines = []
    for name, value in headers:
        if not _TOKEN.fullmatch(name.encode("latin-1", "replace")) or any(
            c in value for c in "\r\n\0"
        ):
            raise ValueError(f"invalid response header {name!r}: {value!r}")
        lines.append(f"{name}: {value}\r\n")
    return lines


def response(
    status: int,
    body: bytes = b"",
    *,
    content_type: str = "text/plain; charset=utf-8",
    headers: Sequence[tuple[str, str]] = (),
) -> bytes:
    """A complete HTTP/1.1 response with ``Content-Length`` and ``Connection: close``."""
    if not 100 <= status <= 599:
        raise ValueError(f"invalid HTTP status {status}")
    fields: list[tuple[str, str]] = []
    if status >= 200 and status not in (204, 304):
        if body:
            fields.append(("Content-Type", content_type))
        fields.append(("Content-Length", str(len(body))))
    elif body:
        raise ValueError(f"a {status} response cannot have a body")
    fields.append(("Connection", "close"))
    fields.extend(headers)
    head = f"HTTP/1.1 {status} {_reason_phrase(status)}\r\n" + "".join(_header_lines(fields))
    return head.encode("latin-1") + b"\r\n" + body


def websocket_accept(key: str) -> str:
    """``Sec-WebSocket-Accept`` for ``key``: base64(SHA-1(key + GUID)), RFC 6455 §4.2.2."""
    digest = hashlib.sha1((key + WEBSOCKET_GUID).encode("ascii")).digest()
    return base64.b64encode(digest).decode("ascii")


def new_websocket_key() -> str:
    """A fresh random ``Sec-WebSocket-Key`` for a client handshake."""
    return base64.b64encode(os.urandom(16)).decode("ascii")


MQTT_SUBPROTOCOL = "mqtt"


def wants_mqtt(request: Request) -> bool:
    """A WebSocket upgrade offering subprotocol ``mqtt`` and not the native one."""
    offered = request._tokens("sec-websocket-protocol")
    return MQTT_SUBPROTOCOL in offered and SUBPROTOCOL not in offered


def handshake_response(request: Request, *, subprotocol: str | None = None) -> bytes:
    """The 101 answer to a valid upgrade; echoes ``migratory.cbor`` if the client offered it
    (or ``subprotocol``, the one the server chose).

    No extension is ever accepted. Raises :class:`HttpError` if ``request`` is
    not a valid WebSocket handshake.
    """
    error = request.websocket_upgrade_error()
    if error is not None:
        raise error
    key = request.header("sec-websocket-key")
    if key is None:
        raise HttpError(426, "WebSocket upgrade required", headers=[("Upgrade", "websocket")])
    lines = [
        "HTTP/1.1 101 Switching Protocols\r\n",
        "Upgrade: websocket\r\n",
        "Connection: Upgrade\r\n",
        f"Sec-WebSocket-Accept: {websocket_accept(key)}\r\n",
    ]
    if subprotocol is not None:
        lines.append(f"Sec-WebSocket-Protocol: {subprotocol}\r\n")
    elif SUBPROTOCOL in request._tokens("sec-websocket-protocol"):
        lines.append(f"Sec-WebSocket-Protocol: {SUBPROTOCOL}\r\n")
    lines.append("\r\n")
    return "".join(lines).encode("ascii")


def handshake_request(
    host: str, path: str, key: str, *, subprotocol: str | None = SUBPROTOCOL
) -> bytes:
    """A client's opening handshake, for raw-socket clients such as load generators."""
    if not path.startswith("/") or not _TARGET.fullmatch(path.encode("ascii", "replace")):
        raise ValueError(f"invalid request path {path!r}")
    fields = [
        ("Host", host),
        ("Upgrade", "websocket"),
        ("Connection", "Upgrade"),
        ("Sec-WebSocket-Key", key),
        ("Sec-WebSocket-Version", "13"),
    ]
    if subprotocol is not None:
        fields.append(("Sec-WebSocket-Protocol", subprotocol))
    head = f"GET {path} HTTP/1.1\r\n" + "".join(_header_lines(fields)) + "\r\n"
    return head.encode("latin-1")


def check_handshake_response(
    data: bytes | bytearray, key: str, *, subprotocol: str | None = SUBPROTOCOL
) -> int | None:
    """How many bytes of ``data`` the server's 101 response takes; None until complete.

    The bytes after it are already WebSocket frames. Raises :class:`HttpError`
    with the server's status if it refused the upgrade, or 502 if the response
    is malformed, has the wrong accept value, negotiates an extension, or a
    subprotocol other than ``subprotocol``.
    """
    end = bytes(data[: _MAX_RESPONSE_HEAD + 4]).find(b"\r\n\r\n")
    if end < 0:
        if len(data) > _MAX_RESPONSE_HEAD:
            raise HttpError(502, "handshake response head too large")
        return None
    lines = bytes(data[:end]).split(b"\r\n")
    status_line = _STATUS_LINE.fullmatch(lines[0])
    if status_line is None:
        raise HttpError(502, "malformed handshake response status line")
    status = int(status_line[1])
    if status != 101:
        raise HttpError(status, f"server refused the upgrade: {lines[0].decode('latin-1')}")
    try:
        headers = tuple(_parse_header_line(line) for line in lines[1:])
    except HttpError:
        raise HttpError(502, "malformed header in handshake response") from None
    reply = Request("GET", "/", "/", {}, headers)
    problem = _response_problem(reply, key, subprotocol)
    if problem:
        raise HttpError(502, problem)
    return end + 4


def _response_problem(reply: Request, key: str, subprotocol: str | None) -> str | None:
    if "websocket" not in reply._tokens("upgrade"):
        return "handshake response lacks 'Upgrade: websocket'"
    if "upgrade" not in reply._tokens("connection"):
        return "handshake response lacks 'Connection: upgrade'"
    if reply.header("sec-websocket-accept") != websocket_accept(key):
        return "wrong Sec-WebSocket-Accept"
    if reply.header("sec-websocket-extensions") is not None:
        return "server negotiated an extension that was not offered"
    chosen = reply.header("sec-websocket-protocol")
    if chosen is not None and chosen != subprotocol:
        return f"server chose subprotocol {chosen!r}, which was not offered"
    return None
