"""The trio adapter of the cluster link: a socket stream plus the sans-I/O codec."""

from __future__ import annotations

import logging
import ssl
from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal

import trio

from cluster import link

if TYPE_CHECKING:
    from migratory.config import Config

log = logging.getLogger("migratory.link")

HANDSHAKE_TIMEOUT = 5.0

DIAL_TIMEOUT = 2.0
"""Seconds a TCP dial to another member may take before it counts as failed."""

CONNECT_ERRORS = (
    OSError,
    EOFError,
    link.LinkError,
    trio.TooSlowError,
    trio.BrokenResourceError,
    trio.ClosedResourceError,
)
"""What dialling a member may raise when the member or the network fails."""
RECV_SIZE = 1 << 16


@dataclass(frozen=True, slots=True)
class ClusterTls:
    """Mutual TLS for the cluster links (ClusterTlsCertificate, ClusterTlsKey,
    ClusterTlsCa): both sides present a certificate the cluster CA signed."""

    accepting: ssl.SSLContext
    dialling: ssl.SSLContext

    @classmethod
    def from_config(cls, config: Config) -> ClusterTls | None:
        """None when the ClusterTls* keys are empty (plain TCP links)."""
        if not config.cluster_tls_certificate:
            return None
        from migratory.tls import cluster_contexts

        accepting, dialling = cluster_contexts(
            config.cluster_tls_certificate, config.cluster_tls_key, config.cluster_tls_ca
        )
        return cls(accepting, dialling)

    def wrap(
        self, stream: trio.abc.Stream, *, server_side: bool
    ) -> trio.SSLStream[trio.abc.Stream]:
        context = self.accepting if server_side else self.dialling
        return trio.SSLStream(stream, context, server_side=server_side)


def secured(
    stream: trio.abc.Stream, tls: ClusterTls | None, *, server_side: bool
) -> trio.abc.Stream:
    """``stream`` inside TLS when the cluster has certificates; the TLS handshake runs
    first thing in :meth:`LinkChannel.handshake`, within its time limit."""
    return stream if tls is None else tls.wrap(stream, server_side=server_side)


def describe(error: BaseException) -> str:
    """What ended a link, in words: the message of each exception a task group raised
    (trio wraps whatever crosses a nursery in an ``ExceptionGroup``)."""
    if isinstance(error, BaseExceptionGroup):
        return "; ".join(describe(e) for e in error.exceptions)
    return str(error) or type(error).__name__


class LinkChannel:
    """An authenticated link to one peer member."""

    def __init__(
        self,
        stream: trio.abc.Stream,
        *,
        role: Literal["accept", "connect"],
        member: str,
        password: str,
    ) -> None:
        self.stream = stream
        self.codec = link.LinkConnection(role=role, member=member, password=password)
        self._send_lock = trio.Lock()
        self.peer: str | None = None

    async def handshake(self, members: frozenset[str] | None = None) -> str:
        """Authenticate both ways; returns the peer's member name.

        An acceptor also checks that the peer is one of ``members`` (ClusterMembers).
        """
        peer = await self._authenticate()
        if members is not None and peer not in members:
            raise link.LinkError(f"peer {peer!r} is not one of ClusterMembers")
        return peer

    async def _authenticate(self) -> str:
        if isinstance(self.stream, trio.SSLStream):
            await self._tls_handshake(self.stream)
        with trio.fail_after(HANDSHAKE_TIMEOUT):
            first = self.codec.initiate()
            if first:
                await self.stream.send_all(first)
            while True:
                event = await self._next_event()
                if isinstance(event, link.Outgoing):
                    await self.stream.send_all(event.data)
                elif isinstance(event, link.Authenticated):
                    self.peer = event.peer
                    return event.peer
                else:
                    raise link.LinkError(f"unexpected {type(event).__name__} before auth")

    @staticmethod
    async def _tls_handshake(stream: trio.SSLStream[trio.abc.Stream]) -> None:
        """Certificates both ways before any byte of the link protocol; a peer without a
        certificate of the cluster CA (or not speaking TLS) ends here."""
        with trio.move_on_after(HANDSHAKE_TIMEOUT) as waited:
            try:
                await stream.do_handshake()
            except trio.BrokenResourceError as exc:
                reason = describe(exc.__cause__ or exc)
                raise link.LinkError(f"TLS handshake failed: {reason}") from exc
        if waited.cancelled_caught:
            raise link.LinkError(
                f"TLS handshake failed: not finished within {HANDSHAKE_TIMEOUT:g} s"
            )

    async def send(self, op: link.LinkOp) -> None:
        data = self.codec.send(op)
        async with self._send_lock:
            await self.stream.send_all(data)

    async def send_encoded(self, frame: bytes) -> None:
        """A frame from :func:`cluster.link.encode_frame` (encoded once for every link)."""
        data = self.codec.send_encoded(frame)
        async with self._send_lock:
            await self.stream.send_all(data)

    async def receive(self) -> link.LinkOp | None:
        """The next operation, or None when the peer closed the link."""
        try:
            event = await self._next_event()
        except (trio.BrokenResourceError, trio.ClosedResourceError, EOFError):
            return None
        if isinstance(event, link.Outgoing | link.Authenticated):
            raise link.LinkError("handshake event after authentication")
        return event

    async def _next_event(self) -> link.LinkEvent:
        while True:
            event = self.codec.next_event()
            if event is not None:
                return event
            data = await self.stream.receive_some(RECV_SIZE)
            if not data:
                raise EOFError("peer closed the link")
            self.codec.receive_data(bytes(data))

    async def aclose(self) -> None:
        with trio.move_on_after(1):
            await self.stream.aclose()


async def connect(
    address: tuple[str, int], *, member: str, password: str, tls: ClusterTls | None = None
) -> LinkChannel:
    """An authenticated link to the member at ``address``. Raises OSError,
    trio.BrokenResourceError (a reset while connecting), EOFError, LinkError or
    trio.TooSlowError: callers that retry must catch them all (``CONNECT_ERRORS``).

    The dial itself is bounded by :data:`DIAL_TIMEOUT`: a SYN nobody answers (a seed
    pod gone with its IP, the name still resolving to it) is retried by the kernel for
    about two minutes, during which a non-seed would wait for that one seed instead of
    trying the next."""
    with trio.fail_after(DIAL_TIMEOUT):
        stream = await trio.open_tcp_stream(*address)
    channel = LinkChannel(
        secured(stream, tls, server_side=False), role="connect", member=member, password=password
    )
    try:
        peer = await channel.handshake()
        if peer != f"{address[0]}:{address[1]}":
            raise link.LinkError(f"dialled {address[0]}:{address[1]} but {peer!r} answered")
    except BaseException:
        await channel.aclose()
        raise
    return channel
