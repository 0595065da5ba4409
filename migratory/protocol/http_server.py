"""The server side of HTTP/1.1 on h11, sans-I/O: bytes in, requests out, responses out.

:class:`HttpServer` wraps one ``h11.Connection``: :meth:`receive_data` takes
what the socket read, :meth:`next_event` returns complete requests (head and
body, the body bounded), a WebSocket upgrade (with the bytes that followed it),
or the client's close. :meth:`respond` turns a response into bytes and starts
the next request cycle when the connection stays open (keep-alive, pipelining:
h11 keeps the requests that arrived early until then). Bad input raises
:class:`~migratory.protocol.http.HttpError` with the status to answer; the
caller then writes :meth:`HttpError.encode` and closes.

A stream that outlives HTTP framing (a WebSocket, Server-Sent Events) leaves
h11 with :meth:`take_over` and writes its own bytes from then on.

:class:`RequestParser` reads one request head for peers that need only a
handshake; the bytes after the head (a client may pipeline its first WebSocket
frame right behind the handshake) are kept in :attr:`RequestParser.trailing`.
"""

from __future__ import annotations

import contextlib
from collections.abc import Sequence
from dataclasses import dataclass, replace
from http import HTTPStatus

import h11

from migratory.protocol.http import HttpError, Request, request_from_head

__all__ = [
    "ClientClosed",
    "HttpServer",
    "RequestParser",
    "RequestReceived",
    "UpgradeRequested",
]

MAX_HEAD_BYTES = 16384
_MIGHT_SWITCH = h11.MIGHT_SWITCH_PROTOCOL  # type: ignore[attr-defined]  # exported, not in __all__


@dataclass(frozen=True, slots=True)
class RequestReceived:
    """A complete request; ``request.body`` holds its body."""

    request: Request


@dataclass(frozen=True, slots=True)
class UpgradeRequested:
    """A valid WebSocket opening handshake; ``trailing``: the bytes already sent after it."""

    request: Request
    trailing: bytes


@dataclass(frozen=True, slots=True)
class ClientClosed:
    """The client closed its side between requests."""


HttpEvent = RequestReceived | UpgradeRequested | ClientClosed


def _h11_reason(status: int, text: str, max_head: int) -> str:
    """h11's words for a refused head, without the client's bytes it quotes
    (``illegal request line: bytearray(b'...')``: a Python repr, and the sender's own
    bytes echoed back), and its ``Receive buffer too long`` said in HTTP's terms."""
    if status == 431:
        return f"request head larger than {max_head} bytes"
    return text.split(": bytearray(", 1)[0].strip() or "bad request"


def _phrase(status: int) -> bytes:
    try:
        return HTTPStatus(status).phrase.encode("ascii")
    except ValueError:
        return b""


class HttpServer:
    """One client connection's HTTP/1.1, server side."""

    __slots__ = (
        "_body", "_conn", "_max_body", "_max_head", "_method", "_out", "_request", "_responding"
    )

    def __init__(self, *, max_body: int, max_head: int = MAX_HEAD_BYTES) -> None:
        self._conn = h11.Connection(h11.SERVER, max_incomplete_event_size=max_head)
        self._max_body = max_body
        self._max_head = max_head  # h11 checks only heads still incomplete; _start the rest
        self._request: Request | None = None
        self._body = bytearray()
        self._out = bytearray()
        self._responding = False  # a request was handed out; no next one until respond()
        self._method = ""

    def receive_data(self, data: bytes) -> None:
        """Feed what the socket read; ``b""`` means the client closed its side."""
        conn = self._conn
        if data and conn.their_state is h11.IDLE and not conn.trailing_data[0]:
            data = data.lstrip(b"\r\n")  # RFC 9112 2.2: blank lines before a request
            if not data:
                return
        with contextlib.suppress(RuntimeError):  # data after the client's close: ignored
            conn.receive_data(data)

    def data_to_send(self) -> bytes:
        """Bytes to write that no response carried (``100 Continue``)."""
        out, self._out = bytes(self._out), bytearray()
        return out

    @property
    def buffered(self) -> int:
        """Bytes held for the body of a request not complete yet (counted with the
        incomplete WebSocket frames in the server's IncompleteFrameBudget)."""
        return len(self._body)

    @property
    def responding(self) -> bool:
        """A request is out and waits for :meth:`respond`."""
        return self._responding

    def next_event(self) -> HttpEvent | None:
        """The next complete request, upgrade or close; None until more data arrives
        (or while a request waits for its response). Raises HttpError."""
        if self._responding:
            return None
        while True:
            try:
                event = self._conn.next_event()
            except h11.RemoteProtocolError as exc:
                status = exc.error_status_hint or 400
                raise HttpError(status, _h11_reason(status, str(exc), self._max_head)) from None
            if event is h11.NEED_DATA or event is h11.PAUSED:
                return None
            if isinstance(event, h11.ConnectionClosed):
                return ClientClosed()
            if isinstance(event, h11.Request):
                self._start(event)
            elif isinstance(event, h11.Data):
                if len(self._body) + len(event.data) > self._max_body:
                    raise HttpError(413, f"request body larger than {self._max_body} bytes")
                self._body += event.data
            elif isinstance(event, h11.EndOfMessage):
                return self._finish()

    def _start(self, event: h11.Request) -> None:
        head = len(event.target) + sum(len(n) + len(v) + 4 for n, v in event.headers)
        if head > self._max_head:
            raise HttpError(431, f"request head larger than {self._max_head} bytes")
        try:
            request = request_from_head(
                event.method.decode("ascii"),
                event.target.decode("ascii"),
                [(n.decode("ascii"), v.decode("latin-1")) for n, v in event.headers],
                event.http_version.decode("ascii"),
            )
        except UnicodeDecodeError:
            raise HttpError(400, "the request target must be ASCII (percent-encode it)") from None
        length = request.header("content-length")
        chunked = request.header("transfer-encoding") is not None
        if length is not None and chunked:  # a smuggling vector: refuse, do not guess
            raise HttpError(400, "both Content-Length and Transfer-Encoding")
        too_long = length is not None and length.isdigit() and int(length) > self._max_body
        if too_long or (chunked and self._max_body == 0):
            raise HttpError(413, f"request body larger than {self._max_body} bytes")
        self._request = request
        self._method = request.method
        self._body = bytearray()
        if self._conn.they_are_waiting_for_100_continue:
            self._out += self._conn.send(h11.InformationalResponse(status_code=100, headers=[]))

    def _finish(self) -> HttpEvent:
        request = self._request
        assert request is not None
        self._request = None
        self._responding = True
        request = replace(request, body=bytes(self._body))
        self._body = bytearray()
        switching = self._conn.their_state is _MIGHT_SWITCH
        if request.is_websocket_upgrade and switching:
            return UpgradeRequested(request, self.take_over())
        return RequestReceived(request)

    def respond(
        self,
        status: int,
        body: bytes = b"",
        *,
        content_type: str = "text/plain; charset=utf-8",
        headers: Sequence[tuple[str, str]] = (),
    ) -> bytes:
        """The response to the request handed out; starts the next cycle if the
        connection stays open (see :attr:`must_close`)."""
        fields = [(name.encode("latin-1"), value.encode("latin-1")) for name, value in headers]
        if status not in (204, 304):
            if body:
                fields.append((b"content-type", content_type.encode("latin-1")))
            fields.append((b"content-length", str(len(body)).encode("ascii")))
        conn = self._conn
        out = conn.send(h11.Response(status_code=status, headers=fields, reason=_phrase(status)))
        out = bytes(self._out) + (out or b"")
        self._out.clear()
        if body and self._method != "HEAD":
            out += conn.send(h11.Data(data=body)) or b""
        out += conn.send(h11.EndOfMessage()) or b""
        self._responding = False
        if conn.our_state is h11.DONE and conn.their_state is h11.DONE:
            conn.start_next_cycle()
        return out

    @property
    def must_close(self) -> bool:
        """The connection must close once what was written is out (HTTP/1.0, the
        client asked, or a response went out before the request's body was read)."""
        return self._conn.our_state is not h11.IDLE and not self._responding

    def take_over(self) -> bytes:
        """Leave HTTP framing: the bytes received after the current request."""
        data, _closed = self._conn.trailing_data
        return bytes(data)


class RequestParser:
    """Reads one request head from a byte stream, on :class:`HttpServer`.

    :meth:`receive_data` returns the :class:`Request` once the head (up to the
    blank line) is complete, None before; it raises :class:`HttpError` for a
    malformed or oversized head, or a request with a body. For peers that read
    one handshake (test servers, tools); the server itself uses :class:`HttpServer`.
    """

    __slots__ = ("_error", "_http", "_request", "_trailing")

    def __init__(self, max_header_bytes: int = 16384) -> None:
        self._http = HttpServer(max_body=0, max_head=max_header_bytes)
        self._request: Request | None = None
        self._trailing = b""
        self._error: HttpError | None = None

    @property
    def request(self) -> Request | None:
        return self._request

    @property
    def trailing(self) -> bytes:
        """The bytes received after the request head (empty until it is complete)."""
        return self._trailing

    def receive_data(self, data: bytes | bytearray | memoryview) -> Request | None:
        """Feed bytes; the request once its head is complete (again on later calls).

        After an :class:`HttpError` every call raises the same error.
        """
        if self._request is not None:
            self._trailing += bytes(data)
            return self._request
        if self._error is not None:
            raise self._error
        try:
            self._http.receive_data(bytes(data))
            event = self._http.next_event()
        except HttpError as exc:
            self._error = exc
            raise
        if isinstance(event, UpgradeRequested):
            self._request, self._trailing = event.request, event.trailing
        elif isinstance(event, RequestReceived):
            self._request, self._trailing = event.request, self._http.take_over()
        return self._request
