"""The trio adapter of the cluster link: a socket stream plus the sans-I/O codec."""

from __future__ import annotations

import logging
import math
import ssl
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal

import trio

from cluster import link
from cluster.agreement import (
    MemberSettings,
    Repeats,
    disagreement,
    entitlement_difference,
    entitlement_key_difference,
    name_clash,
    soft_differences,
)

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

FRAME_STALL = 10.0
"""Seconds a frame begun may go without a byte of its rest before the link ends: a
peer that sends part of a frame and stops held its link (and the part, up to the
frame limit) for ever. An idle link between frames has no limit (a non-seed forwards
only when its clients publish)."""


_NOTED = Repeats(every=600.0)
"""Allowed differences already logged (each once per peer every 10 minutes)."""


class Disagreement(link.LinkError):
    """The peer is not the member this one expects, or its cluster settings disagree
    with this member's (:func:`cluster.agreement.disagreement`): the link is refused."""


class Unanswered(link.LinkError):
    """The peer took the dial (or began the handshake) and then sent no byte within the
    dialler's answer deadline (:func:`connect`'s ``answer_within``): stopped, frozen, or
    too starved to keep a link anyway."""


class OlderPeer(link.LinkError):
    """The peer closed the link on receiving this member's settings: a migratory that
    does not know them (or an acceptor that refused this member before reading them)."""


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
        settings: MemberSettings | None = None,
        max_frame: int = link.MAX_FRAME,
    ) -> None:
        """``settings``: this member's, exchanged with the peer's after authentication
        (None: nothing exchanged, as an older migratory); ``max_frame``: the largest
        frame taken from the peer (an acceptor's: :func:`link.accepted_frame_limit`; a
        connector's: :func:`link.connected_frame_limit`)."""
        self.stream = stream
        self.codec = link.LinkConnection(role=role, member=member, password=password,
                                         max_frame=max_frame)
        self._send_lock = trio.Lock()
        self.peer: str | None = None
        self.settings = settings
        self.peer_settings: MemberSettings | None = None
        """The peer's settings once exchanged (None: not exchanged, an older peer)."""
        self._first: link.LinkOp | None = None  # an older connector's first operation
        self.received = 0
        """Bytes received so far: an operation still arriving (a cache sync in parts,
        tens of megabytes) shows it is coming before it is whole."""

    async def handshake(
        self,
        members: frozenset[str] | None = None,
        *,
        authenticated: Callable[[], None] | None = None,
    ) -> str:
        """Authenticate both ways, then exchange and compare the members' settings;
        returns the peer's member name. Raises :class:`Disagreement` when they disagree
        (after the acceptor sent its own, so both sides can say why).

        An acceptor also checks that the peer is one of ``members`` (ClusterMembers).
        ``authenticated()`` is called as soon as the peer proved the password (the
        connection no longer counts as a stranger's, cluster/link_accept.py).
        """
        peer = await self._authenticate()
        if authenticated is not None:
            authenticated()
        if self.settings is not None:
            # no time limit: the peer is authenticated, and an older one sends its first
            # operation only when it has one (a Standard forwarder, its first publish)
            await self._agree(peer, self.settings)
        if members is not None and peer not in members:
            raise Disagreement(f"peer {peer!r} is not one of ClusterMembers")
        return peer

    async def _agree(self, peer: str, mine: MemberSettings, silence: float | None = None) -> None:
        if self.codec.role == "connect":
            await self.send(link.Settings(mine))
            op = await self._receive(silence)
            if op is None:
                raise OlderPeer(f"{peer} closed the link on receiving this member's settings")
        else:
            op = await self.receive()
            if op is None:
                raise EOFError("peer closed the link")
            if not isinstance(op, link.Settings):
                self._first = op  # an older migratory: nothing to compare
                return
            if op.settings.limits is None:  # what a connector that predates them reads
                mine = mine.without_limits()
            elif op.settings.entitlement_keys is None:  # (the same, the keys' digests)
                mine = mine.without_entitlement_keys()
            await self.send(link.Settings(mine))
        if not isinstance(op, link.Settings):
            raise link.LinkError(f"{peer} answered {type(op).__name__} to Settings")
        theirs = op.settings
        if theirs.member != peer:
            raise Disagreement(f"{peer}'s settings name another member, {theirs.member}")
        self.peer_settings = theirs
        reason = disagreement(mine, theirs)
        if reason is not None:
            raise Disagreement(reason)
        for note in soft_differences(mine, theirs):
            if _NOTED.first(peer, note, time.monotonic()):
                log.info("cluster settings: %s", note)
        for warned in (name_clash(mine, theirs), entitlement_difference(mine, theirs),
                       entitlement_key_difference(mine, theirs)):
            if warned is not None and _NOTED.first(peer, warned, time.monotonic()):
                log.warning("cluster settings: %s", warned)

    async def _authenticate(self, dialled: str = "the peer", silence: float | None = None) -> str:
        """``silence``: seconds the peer may go without a byte before :class:`Unanswered`
        (None: only the handshake's :data:`HANDSHAKE_TIMEOUT`)."""
        if isinstance(self.stream, trio.SSLStream):
            await self._tls_handshake(self.stream, silence)
        proved = False
        with trio.fail_after(HANDSHAKE_TIMEOUT):
            first = self.codec.initiate()
            if first:
                await self.stream.send_all(first)
            while True:
                try:
                    event = await self._next_event(silence)
                except (EOFError, trio.BrokenResourceError) as exc:
                    if not proved:
                        raise
                    raise Disagreement(
                        f"authentication failed: {dialled} closed the link on this member's "
                        "proof (a different ClusterPassword?)"
                    ) from exc
                if isinstance(event, link.Outgoing):
                    await self.stream.send_all(event.data)
                    proved = self.codec.role == "connect"
                elif isinstance(event, link.Authenticated):
                    self.peer = event.peer
                    return event.peer
                else:
                    raise link.LinkError(f"unexpected {type(event).__name__} before auth")

    @staticmethod
    async def _tls_handshake(
        stream: trio.SSLStream[trio.abc.Stream], silence: float | None = None
    ) -> None:
        """Certificates both ways before any byte of the link protocol; a peer without a
        certificate of the cluster CA (or not speaking TLS) ends here. The dialler's
        handshake waits for one answer of the peer (its flight after the ClientHello):
        within ``silence`` when given."""
        limit = HANDSHAKE_TIMEOUT if silence is None else min(silence, HANDSHAKE_TIMEOUT)
        with trio.move_on_after(limit) as waited:
            try:
                await stream.do_handshake()
            except trio.BrokenResourceError as exc:  # a certificate refused, or no TLS
                reason = describe(exc.__cause__ or exc)
                if "WRONG_VERSION_NUMBER" in reason and not stream.server_side:
                    reason += (" (the peer answers without TLS: ClusterTlsCertificate, "
                               "ClusterTlsKey and ClusterTlsCa are set here, not there)")
                raise Disagreement(f"TLS handshake failed: {reason}") from exc
        if waited.cancelled_caught:
            if limit < HANDSHAKE_TIMEOUT:
                raise Unanswered(f"no TLS answer within {limit:g} s")
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
        return await self._receive(None)

    async def _receive(self, silence: float | None) -> link.LinkOp | None:
        if self._first is not None:
            first, self._first = self._first, None
            return first
        try:
            event = await self._next_event(silence)
        except (trio.BrokenResourceError, trio.ClosedResourceError, EOFError):
            return None
        if isinstance(event, link.Outgoing | link.Authenticated):
            raise link.LinkError("handshake event after authentication")
        return event

    async def receive_within(self, silence: float) -> link.LinkOp | None:
        """:meth:`receive`, or ``trio.TooSlowError`` once ``silence`` seconds pass in
        which not a byte came: a peer still sending a long operation is not silent."""
        while True:
            heard = self.received
            with trio.move_on_after(silence):
                return await self.receive()  # a cancelled receive loses no byte
            if self.received == heard:
                raise trio.TooSlowError(f"nothing received for {silence:g} s")

    async def _next_event(self, silence: float | None = None) -> link.LinkEvent:
        """The codec's next event, reading as needed; ``silence``: seconds without a byte
        before :class:`Unanswered` (a handshake's answer deadline)."""
        while True:
            event = self.codec.next_event()
            if event is not None:
                return event
            stall = FRAME_STALL if self.codec.buffered else None  # a frame begun
            limit = min(x for x in (stall, silence, math.inf) if x is not None)
            data: bytes | bytearray = b""
            with trio.move_on_after(limit) as waited:
                data = await self.stream.receive_some(RECV_SIZE)
            if waited.cancelled_caught:
                if silence is not None and limit == silence:
                    raise Unanswered(f"no answer within {silence:g} s")
                raise link.LinkViolation(
                    f"a frame begun ({self.codec.buffered} bytes of it) got no byte "
                    f"more for {FRAME_STALL:g} s", "frame_stall")
            if not data:
                raise EOFError("peer closed the link")
            self.received += len(data)
            self.codec.receive_data(bytes(data))

    async def aclose(self) -> None:
        with trio.move_on_after(1):
            await self.stream.aclose()


def tls_only(peer: str) -> str:
    """Why a member without ClusterTls* keys cannot link with ``peer``."""
    return (f"{peer} answers only TLS on its cluster port and this member's cluster links "
            "are not TLS: ClusterTlsCertificate, ClusterTlsKey and ClusterTlsCa are set "
            "there, not here")


def probe_context() -> ssl.SSLContext:
    """The TLS of :func:`speaks_tls`: no certificate checked, and the probe's name
    offered (:data:`~cluster.link_limits.TLS_PROBE_ALPN`) so that a plain member takes it
    for a question, not for a member with ClusterTls* keys."""
    context = ssl.create_default_context()
    context.check_hostname = False
    context.verify_mode = ssl.CERT_NONE
    context.set_alpn_protocols([link.TLS_PROBE_ALPN])
    return context


async def speaks_tls(address: tuple[str, int]) -> bool:
    """Whether the member at ``address`` answers a TLS handshake (its certificate not
    checked, none shown). Asked once a link handshake without TLS ended having heard
    nothing from it (timed out, or closed by it after its own :data:`HANDSHAKE_TIMEOUT`):
    a member whose links are TLS waits for a ClientHello where one without sends its
    challenge at once. Before, a member left without the ClusterTls* keys took that for
    peers that could not be asked, counting for nothing: in Standard mode it was ready
    and served its clients alone."""
    context = probe_context()
    with trio.move_on_after(DIAL_TIMEOUT + HANDSHAKE_TIMEOUT):
        try:
            stream = trio.SSLStream(await trio.open_tcp_stream(*address), context)
        except OSError:
            return False
        try:
            await stream.do_handshake()
            return True
        except trio.BrokenResourceError as exc:  # a TLS alert is TLS too (no certificate)
            return isinstance(exc.__cause__, ssl.SSLError) and "ALERT" in str(exc.__cause__)
        finally:
            with trio.move_on_after(1):
                await stream.aclose()
    return False


async def connect(
    address: tuple[str, int],
    *,
    member: str,
    password: str,
    tls: ClusterTls | None = None,
    settings: MemberSettings | None = None,
    max_frame: int,
    answer_within: float | None = None,
) -> LinkChannel:
    """An authenticated link to the member at ``address``, taking frames of up to
    ``max_frame`` bytes from it (:func:`link.connected_frame_limit`). Raises OSError,
    trio.BrokenResourceError (a reset while connecting), EOFError, LinkError (and its
    :class:`Disagreement`) or trio.TooSlowError: callers that retry must catch them all
    (``CONNECT_ERRORS``).

    With ``settings``, the members compare theirs first (:class:`Disagreement` when
    they disagree); a peer that closes the link on receiving them (an older migratory)
    is dialled again with them as a member before the entitlement's keys sends them,
    then as one before :class:`~cluster.agreement.MemberLimits`, then, closed again,
    without them (the link comes back with ``peer_settings`` None).

    The dial itself is bounded by :data:`DIAL_TIMEOUT`: a SYN nobody answers (a seed
    pod gone with its IP, the name still resolving to it) is retried by the kernel for
    about two minutes, during which a non-seed would wait for that one seed instead of
    trying the next.

    With ``answer_within``, each answer the handshake waits for must come within that
    many seconds of silence (:class:`Unanswered`), and a peer that answered nothing is
    not asked whether it speaks TLS: a stopped member takes the dial (the kernel accepts
    it) and says nothing, which held a non-seed for the handshake's 5 s and the TLS
    question's 7 s after it. The agreement probe, which dials without it, asks that
    question of every seed."""
    dial = _Dial(address, member, password, tls, max_frame, answer_within)
    try:
        return await dial.link(settings)
    except OlderPeer as exc:
        older = exc
    if settings is not None and settings.entitlement_keys is not None:
        try:  # a member that predates the entitlement's keys in Settings closes on them
            return await dial.link(settings.without_entitlement_keys())
        except OlderPeer as exc:
            older = exc
    if settings is not None and settings.limits is not None:
        try:  # a member that predates the limits in Settings closes on them: without
            return await dial.link(settings.without_limits())
        except OlderPeer as exc:
            older = exc
    log.info("%s: linking without comparing settings (an older migratory?)", older)
    return await dial.link(None)


@dataclass(frozen=True, slots=True)
class _Dial:
    """One :func:`connect`: where, as whom, and how long each answer may take."""

    address: tuple[str, int]
    member: str
    password: str
    tls: ClusterTls | None
    max_frame: int
    answer_within: float | None

    async def link(self, settings: MemberSettings | None) -> LinkChannel:
        """One dial and handshake, exchanging ``settings`` (None: none)."""
        address, tls, silence = self.address, self.tls, self.answer_within
        with trio.fail_after(DIAL_TIMEOUT):
            stream = await trio.open_tcp_stream(*address)
        channel = LinkChannel(
            secured(stream, tls, server_side=False),
            role="connect",
            member=self.member,
            password=self.password,
            settings=settings,
            max_frame=self.max_frame,
        )
        try:
            peer = await self._authenticate(channel)
            if settings is not None:
                with trio.fail_after(HANDSHAKE_TIMEOUT):
                    await channel._agree(peer, settings, silence)
        except BaseException:
            await channel.aclose()
            raise
        return channel

    async def _authenticate(self, channel: LinkChannel) -> str:
        address = self.address
        try:
            peer = await channel._authenticate(f"{address[0]}:{address[1]}", self.answer_within)
        except link.VersionMismatch as exc:  # refused, and said why: not unreachable
            raise Disagreement(exc.reason) from exc
        except (trio.TooSlowError, EOFError, trio.BrokenResourceError):
            # nothing heard: a member whose links are TLS waits for a ClientHello (and
            # closes after HANDSHAKE_TIMEOUT) where one without sends its challenge at once
            if self.tls is None and channel.received == 0 and await speaks_tls(address):
                raise Disagreement(tls_only(f"{address[0]}:{address[1]}")) from None
            raise
        if peer != f"{address[0]}:{address[1]}":
            raise Disagreement(f"dialled {address[0]}:{address[1]} but {peer!r} answered")
        return peer
