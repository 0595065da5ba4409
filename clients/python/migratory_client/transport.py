"""The WebSocket connection under one session: opened within a time limit, and always
torn down when the session ends.

trio-websocket's ``open_websocket_url`` waits on exit for its background reader task,
and that task can wait forever: it hands each received message to a one-slot channel,
and ``WebSocketConnection.aclose()`` closes that channel only after writing the close
frame. When the write fails (the peer reset the connection) or is cancelled (the peer
does not read), the channel stays open, nobody reads it any more, and a reader holding
the next message never ends (trio-websocket 0.12.2, ``_aclose``). The client then never
learns that its session is over: no SERVER_DOWN, no reconnect (chaos run ``fix1``).

Here the TCP stream and the reader task are ours: when the session is done, the stream
is closed and the reader cancelled, whatever either was doing. Being polite (the close
frame, with a time limit) is the session's business, before that.

The same library waits for the upgrade's answer only on an event its reader sets when
the answer comes: a reader that ends first -- the server closed the connection without
a word (``ws://`` to a TLS port), or the TLS handshake failed (a certificate the client
does not trust) -- leaves the wait to ``connect_timeout``, and the reason was lost. Here
the stream says so at once: :class:`UpgradeStream` turns an end before the answer into
:class:`ClosedBeforeUpgrade`, which ends the reader and the wait with it.
"""

from __future__ import annotations

import os
import socket
import ssl
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import TypeVar
from urllib.parse import urlsplit

import trio
from trio_websocket import WebSocketConnection, wrap_client_stream

from migratory_client.progress import ProgressStream, WriteProgress

__all__ = [
    "ClosedBeforeUpgrade", "Endpoint", "describe_connect_failure", "run_connection", "single_error"
]

T = TypeVar("T")
RECEIVE_BUFFER_BYTES = 65536


@dataclass(frozen=True, slots=True)
class Endpoint:
    """Where a ``ws://`` or ``wss://`` URL points."""

    host: str
    port: int
    resource: str
    secure: bool

    @classmethod
    def of(cls, url: str) -> Endpoint:
        parts = urlsplit(url)
        if parts.scheme not in ("ws", "wss") or not parts.hostname:
            raise ValueError(f"not a ws:// or wss:// URL with a host: {url!r}")
        secure = parts.scheme == "wss"
        port = parts.port or (443 if secure else 80)
        resource = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
        return cls(parts.hostname, port, resource, secure)

    @property
    def host_header(self) -> str:
        """RFC 7230 5.4 / RFC 3986 3.2.2: an IPv6 literal in brackets (``[::1]:8800``;
        ``::1:8800`` names no host and port)."""
        default = 443 if self.secure else 80
        host = f"[{self.host}]" if ":" in self.host else self.host
        return host if self.port == default else f"{host}:{self.port}"

    async def open_stream(
        self, tls: ssl.SSLContext | None = None
    ) -> trio.SocketStream | trio.SSLStream[trio.SocketStream]:
        """``tls``: the context for ``wss://`` (default: the system's CAs)."""
        if self.secure:
            context = tls or ssl.create_default_context()
            return await trio.open_ssl_over_tcp_stream(
                self.host, self.port, ssl_context=context, https_compatible=True
            )
        return await trio.open_tcp_stream(self.host, self.port)


class ClosedBeforeUpgrade(OSError):
    """The connection ended before the server answered the WebSocket upgrade."""


class UpgradeStream(trio.abc.Stream):
    """``inner``, whose end before the whole head of the upgrade's answer came (an EOF,
    a reset, a failed TLS handshake) raises :class:`ClosedBeforeUpgrade` naming why,
    instead of the ``BrokenResourceError`` trio-websocket swallows."""

    def __init__(self, inner: trio.abc.Stream) -> None:
        self.inner = inner
        self.answered = False
        self._tail = b""

    def _ended(self, exc: BaseException | None) -> ClosedBeforeUpgrade:
        why = "the server closed the connection without answering the WebSocket upgrade"
        cause = exc and exc.__cause__
        if isinstance(cause, ssl.SSLCertVerificationError):
            why = f"TLS: the server's certificate is not trusted: {cause.verify_message}"
        elif isinstance(cause, ssl.SSLError):
            why = f"TLS handshake failed: {cause.reason or cause}"
        elif exc is not None:
            why = f"the connection failed before the WebSocket upgrade: {cause or repr(exc)}"
        return ClosedBeforeUpgrade(why)

    async def send_all(self, data: bytes | bytearray | memoryview) -> None:
        try:
            await self.inner.send_all(data)
        except trio.BrokenResourceError as exc:
            if self.answered:
                raise
            raise self._ended(exc) from exc

    async def wait_send_all_might_not_block(self) -> None:
        await self.inner.wait_send_all_might_not_block()

    async def receive_some(self, max_bytes: int | None = None) -> bytes | bytearray:
        try:
            data = await self.inner.receive_some(max_bytes)
        except trio.BrokenResourceError as exc:
            if self.answered:
                raise
            raise self._ended(exc) from exc
        if not self.answered:
            if not data:
                raise self._ended(None)
            seen = self._tail + bytes(data)
            self.answered = b"\r\n\r\n" in seen  # the end of the answer's head
            self._tail = seen[-3:]
        return data

    async def aclose(self) -> None:
        await self.inner.aclose()


def describe_connect_failure(exc: BaseException, url: str) -> str:
    """What an operator reads of a failed attempt to connect to ``url``: the system's
    reason for each address tried (``Connection refused``), not trio's ``all attempts
    to connect to ... failed`` that keeps them in its cause, nor a bare repr."""
    cause = exc.__cause__
    if isinstance(exc, OSError) and isinstance(cause, BaseExceptionGroup):
        reasons = dict.fromkeys(_reason(each) for each in cause.exceptions)
        return f"{exc}: {'; '.join(reasons)}"
    if isinstance(exc, socket.gaierror):
        return f"cannot resolve {Endpoint.of(url).host!r}: {exc.strerror}"
    if isinstance(exc, ClosedBeforeUpgrade) or cause is None:
        return _reason(exc)
    return str(cause) or _reason(exc)


def _reason(exc: BaseException) -> str:
    if isinstance(exc, OSError) and not isinstance(exc, socket.gaierror) and exc.errno:
        return os.strerror(exc.errno)
    return str(exc) or repr(exc)


async def run_connection(
    url: str,
    serve: Callable[[WebSocketConnection], Awaitable[T]],
    *,
    subprotocols: Sequence[str],
    max_message_size: int,
    connect_timeout: float,
    tls: ssl.SSLContext | None = None,
    progress: WriteProgress | None = None,
) -> T:
    """Open a WebSocket connection to ``url`` and return what ``serve(connection)``
    returns; the connection is gone when this returns or raises.

    Raises OSError, trio.BrokenResourceError or trio_websocket.HandshakeError when the
    connection cannot be opened, trio.TooSlowError after ``connect_timeout`` s.
    ``progress`` counts the bytes the connection writes (see migratory_client.progress).
    """
    endpoint = Endpoint.of(url)
    try:
        async with trio.open_nursery() as nursery:  # trio-websocket's reader task
            opened: list[trio.abc.Stream] = []
            try:
                with trio.fail_after(connect_timeout):
                    stream = await endpoint.open_stream(tls)
                    opened.append(stream)
                    watched = UpgradeStream(stream)
                    counted = watched if progress is None else ProgressStream(watched, progress)
                    # typed as a socket or TLS stream, any trio Stream works (only
                    # ws.local / ws.remote, unused here, become a repr)
                    connection = await wrap_client_stream(
                        nursery,
                        counted,  # type: ignore[arg-type]
                        endpoint.host_header,
                        endpoint.resource,
                        subprotocols=subprotocols,
                        max_message_size=max_message_size,
                        receive_buffer_size=RECEIVE_BUFFER_BYTES,
                    )
                return await serve(connection)
            finally:
                for each in opened:
                    await trio.aclose_forcefully(each)
                nursery.cancel_scope.cancel()
    except BaseExceptionGroup as group:
        single = single_error(group)
        if single is group:
            raise
        raise single from single.__cause__  # (trio's connect failure: the reasons)


def single_error(group: BaseExceptionGroup[BaseException]) -> BaseException:
    """The one error that is not a cancellation, if there is exactly one (typically the
    reader task's ``ConnectionRejected``); else the group as it is."""
    errors = group.subgroup(lambda e: not isinstance(e, trio.Cancelled))
    if errors is not None and len(errors.exceptions) == 1:
        only = errors.exceptions[0]
        if not isinstance(only, BaseExceptionGroup):
            return only
    return group
