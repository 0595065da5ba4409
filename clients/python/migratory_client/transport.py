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
"""

from __future__ import annotations

import ssl
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import TypeVar
from urllib.parse import urlsplit

import trio
from trio_websocket import WebSocketConnection, wrap_client_stream

from migratory_client.progress import ProgressStream, WriteProgress

__all__ = ["Endpoint", "run_connection"]

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
        default = 443 if self.secure else 80
        return self.host if self.port == default else f"{self.host}:{self.port}"

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
                    counted = stream if progress is None else ProgressStream(stream, progress)
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
        raise _single(group) from None


def _single(group: BaseExceptionGroup[BaseException]) -> BaseException:
    """The one error that is not a cancellation, if there is exactly one (typically the
    reader task's ``ConnectionRejected``); else the group as it is."""
    errors = group.subgroup(lambda e: not isinstance(e, trio.Cancelled))
    if errors is not None and len(errors.exceptions) == 1:
        only = errors.exceptions[0]
        if not isinstance(only, BaseExceptionGroup):
            return only
    return group
