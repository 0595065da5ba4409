"""Taking a cluster link a peer opened: its handshake, bounded and refused in words.

The trio side of :mod:`migratory.server.handshake_slots` for cluster links, shared by
the Guaranteed members' :class:`cluster.peers.PeerService` and the Standard members'
listener (:mod:`cluster.standard`). Each connection's handshake runs in a cancel scope; when
more than ``MAX_PENDING_HANDSHAKES`` are still proving the password, one is cancelled
(the oldest, or the oldest of an address holding more than half) and its connection
refused, logged. Before that, at accept, more than ``LINK_CONNECTIONS_PER_SECOND`` new
connections a second from one address are reset (:meth:`HandshakeGate.admit`: no TLS
handshake for them), and so are those past their address's share of
``LINK_HANDSHAKES_PER_SECOND`` for all addresses together (a flood from many
addresses). An IPv6 address counts as its /64.

Refusals are logged at warning once a minute per address and kind of reason (the
reasons name what the stranger sent -- a frame's size, a member name, a tag -- and a
stranger who varies it must not get a line per connection), for at most
:data:`SOURCES_PER_KIND` addresses per kind a minute (:class:`StrangerRefusals`).
"""

from __future__ import annotations

import contextlib
import itertools
import logging
import re
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Final

import trio

from cluster import link
from cluster.agreement import Repeats
from cluster.link_io import HANDSHAKE_TIMEOUT, Disagreement, LinkChannel, describe
from cluster.link_limits import VIOLATION_RULES
from migratory.server.front_rate import ConnectionRate, address_group
from migratory.server.handshake_share import HandshakeShare
from migratory.server.handshake_slots import PendingHandshakes

log = logging.getLogger("migratory.cluster")

REFUSED_ERRORS = (link.LinkError, trio.TooSlowError, OSError, EOFError, trio.BrokenResourceError)
"""What a stranger's connection can raise during the handshake (the link is refused)."""

MAX_PENDING_HANDSHAKES: Final = 128
"""Connections per cluster listener still proving the password (the Raft port's front
keeps as many, cluster/raft_front_server.py). Both fit in ``FileDescriptorReserve``.
Unbounded, 2,000 idle connections held 2,017 descriptors of a seed, and once they
reached its open-file limit the Raft leader could not write its journal and stopped
(800 idle connections against a limit of 600: the seed exited with status 1). A
member's handshake is one round trip and a few HMACs (milliseconds)."""

LINK_CONNECTIONS_PER_SECOND: Final = 100
"""New connections to a cluster link port per second from one address (an IPv6
address: its /64, :func:`~migratory.server.front_rate.address_group`), bursts of one
second's worth; one more is reset as soon as it is accepted, before its handshake. With
ClusterTls* that handshake is TLS: a key exchange and a signature for the bytes of a
stranger's ClientHello, who was not rate-limited (a flood from one address could keep
a member's CPU busy). A member dials a peer once per role (Raft peer, upstream,
forwarding, settings probe) and again at most every 0.3 s while refused: members of a
test cluster, all on 127.0.0.1, stay far below it."""

LINK_HANDSHAKES_PER_SECOND: Final = 200
"""New connections to a cluster link port per second from all addresses together,
shared between them (:class:`~migratory.server.handshake_share.HandshakeShare`: an
address under its share, 200 / (addresses seen in the last second + 1), first; one
over it only while half a second's worth is left); one more is reset at accept. The
per-address rate above binds first for one address; this bounds a flood from many,
each under it (20 addresses x 100 a second were ~2,000 TLS handshakes a second asked
of a member), and keeps a member's dial, a few a second from its own address, under
its share whatever the number of flooding addresses."""

MAX_LINKS_PER_PEER: Final = 8
"""Authenticated links one member may hold to this listener at once; one more closes
its oldest (counted: ``links``). A member dials a peer once per role (upstream and
forwarding, a sync, the settings probe); one restarted before its old links were
noticed dead has a few more. Unbounded, one peer with the password could hold as many
as it liked, each with up to a frame of buffer."""

SOURCES_PER_KIND = 10
"""Addresses a kind of refusal is logged for per minute; the rest are counted."""

_VARYING = re.compile(r"'(?:[^'\\]|\\.)*'|\"(?:[^\"\\]|\\.)*\"|0x[0-9a-f]+|\d+")
_NOT_CBOR = "not valid CBOR"


def reason_kind(reason: str) -> str:
    """``reason`` without what the peer chose (quoted names, numbers, the CBOR decoder's
    account of the bytes): the key under which a refusal is logged once a minute."""
    cut = reason.find(_NOT_CBOR)
    if cut >= 0:
        reason = reason[: cut + len(_NOT_CBOR)]
    return _VARYING.sub("_", reason)


@dataclass
class StrangerRefusals:
    """Which refusals of a listener's strangers to log: each address and kind of reason
    once a minute, and each kind for at most ``sources_per_kind`` addresses a minute (a
    stranger may come from as many as it likes: any of 127.0.0.0/8 on loopback, an IPv6
    prefix). The refusals not logged are counted; the next line of their kind says how
    many."""

    every: float = 60.0
    sources_per_kind: int = SOURCES_PER_KIND
    _repeats: Repeats = field(init=False)
    _kinds: dict[str, list[float]] = field(default_factory=dict)
    """kind -> [start of its minute, addresses logged in it, refusals not logged]"""

    def __post_init__(self) -> None:
        self._repeats = Repeats(every=self.every)

    def line(self, source: str, kind: str, now: float) -> str | None:
        """``None``: no line now; else what the line adds ("" or how many refusals of
        this kind went unlogged since its last line)."""
        window = self._kinds.get(kind)
        if window is None or now - window[0] >= self.every:
            if window is None and len(self._kinds) >= 1024:
                self._kinds.clear()
            window = self._kinds[kind] = [now, 0, window[2] if window else 0]
        if window[1] >= self.sources_per_kind:
            window[2] += 1
            return None
        if not self._repeats.first(source, kind, now):
            window[2] += 1
            return None
        window[1] += 1
        unlogged, window[2] = int(window[2]), 0
        return f" ({unlogged} more like it not logged)" if unlogged else ""


@dataclass
class _Slot:
    key: int
    scope: trio.CancelScope
    gate: HandshakeGate

    def leave(self) -> None:
        """Authenticated (or ended): no longer counted, never cancelled by the gate."""
        self.gate.leave(self.key)


@dataclass
class HandshakeGate:
    """The connections of one listener still authenticating (at most ``limit``)."""

    limit: int = MAX_PENDING_HANDSHAKES
    rate: ConnectionRate = field(
        default_factory=lambda: ConnectionRate(LINK_CONNECTIONS_PER_SECOND))
    """New connections per second per address (:meth:`admit`)."""
    share: HandshakeShare = field(
        default_factory=lambda: HandshakeShare(LINK_HANDSHAKES_PER_SECOND))
    """New connections per second of all addresses, shared between them (:meth:`admit`)."""
    pending: PendingHandshakes[int] = field(init=False)
    refusals: StrangerRefusals = field(default_factory=StrangerRefusals)
    """What of its refusals to log."""
    versions_refused: int = 0
    """Connections refused in their handshake for another link protocol version."""
    violations: dict[str, int] = field(
        default_factory=lambda: dict.fromkeys(VIOLATION_RULES, 0))
    """rule -> authenticated links ended because the peer broke it
    (:class:`~cluster.link_limits.LinkViolation`)."""
    max_links_per_peer: int = MAX_LINKS_PER_PEER
    _scopes: dict[int, trio.CancelScope] = field(default_factory=dict)
    _keys: itertools.count[int] = field(default_factory=itertools.count)
    _links: dict[str, list[trio.CancelScope]] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.pending = PendingHandshakes(self.limit)

    @property
    def refused(self) -> int:
        """Connections closed to keep the limit."""
        return self.pending.evicted

    def refusal_counts(self) -> dict[str, int]:
        """Connections refused before their handshake was done, by limit (the label of
        ``migratory_cluster_link_refused_total``)."""
        return {"MAX_PENDING_HANDSHAKES": self.pending.evicted,
                "LINK_CONNECTIONS_PER_SECOND": self.rate.refused,
                "LINK_HANDSHAKES_PER_SECOND": self.share.refused,
                "LINK_VERSION": self.versions_refused}

    @contextlib.contextmanager
    def linked(self, peer: str) -> Iterator[trio.CancelScope]:
        """An authenticated link from ``peer``, for as long as it is served: in a cancel
        scope that the link after the last one :data:`MAX_LINKS_PER_PEER` allows
        cancels (the oldest link of that peer ends)."""
        scope = trio.CancelScope()
        links = self._links.setdefault(peer, [])
        links.append(scope)
        if len(links) > self.max_links_per_peer:
            oldest = links.pop(0)
            oldest.cancel()
            self.violations["links"] = self.violations.get("links", 0) + 1
            log.warning("link from %s closed: more than %d links from one member at once, "
                        "the oldest closed (links)", peer, self.max_links_per_peer)
        try:
            with scope:
                yield scope
        finally:
            if scope in links:
                links.remove(scope)
            if not links:
                self._links.pop(peer, None)

    def violated(self, peer: str, error: BaseException) -> None:
        """An authenticated link from ``peer`` ended for breaking a link rule
        (``error``, or each in a group): counted by rule, logged at warning (the peer
        has the password: a bug, or an attack from inside)."""
        if isinstance(error, BaseExceptionGroup):
            for inner in error.exceptions:
                self.violated(peer, inner)
            return
        if isinstance(error, link.LinkViolation):
            self.violations[error.rule] = self.violations.get(error.rule, 0) + 1
            log.warning("link from %s closed: %s (%s)", peer, error.reason, error.rule)

    def admit(self, source: str) -> bool:
        """Whether a connection just accepted from ``source`` may start its handshake
        (False: past :data:`LINK_CONNECTIONS_PER_SECOND` from its address, or past its
        share of :data:`LINK_HANDSHAKES_PER_SECOND`; the listener resets it)."""
        group, now = address_group(source), trio.current_time()
        if not self.rate.take(group, now):
            _refused(self, source, f"more than {LINK_CONNECTIONS_PER_SECOND} new "
                     "connections a second from this address (LINK_CONNECTIONS_PER_SECOND): "
                     "reset at accept")
            return False
        if not self.share.take(group, now):
            _refused(self, source, f"past this address's share of "
                     f"{LINK_HANDSHAKES_PER_SECOND} new connections a second "
                     "(LINK_HANDSHAKES_PER_SECOND): reset at accept")
            return False
        return True

    def enter(self, source: str) -> _Slot:
        """A new connection from ``source``; cancels the scope of one that must make room
        (counted per :func:`~migratory.server.front_rate.address_group`: an IPv6
        address by its /64)."""
        key = next(self._keys)
        slot = _Slot(key, trio.CancelScope(), self)
        self._scopes[key] = slot.scope
        evicted = self.pending.add(key, address_group(source))
        if evicted is not None:
            self._scopes.pop(evicted.key).cancel()
        return slot

    def leave(self, key: int) -> None:
        self.pending.remove(key)
        self._scopes.pop(key, None)


async def accept_link(
    channel: LinkChannel,
    *,
    source: str,
    members: frozenset[str],
    gate: HandshakeGate,
    refusals: Repeats,
) -> str | None:
    """The peer's member name once the handshake is done; ``None`` if it was refused
    (logged). Errors of an authenticated link are the caller's. ``refusals``: which
    refusals of authenticated peers to log (the gate's own for strangers')."""
    slot = gate.enter(source)
    peer: str | None = None
    try:
        with slot.scope:
            peer = await channel.handshake(members, authenticated=slot.leave)
    except link.VersionMismatch as exc:
        gate.versions_refused += 1
        _refused(gate, source, exc.reason)
    except Disagreement as exc:
        if channel.peer is None:  # TLS refused: not authenticated
            _refused(gate, source, exc.reason)
        elif refusals.first(channel.peer, reason_kind(exc.reason), trio.current_time()):
            log.warning("cluster link from %s refused: %s", channel.peer, exc.reason)
    except link.TlsProbe as exc:  # a peer asking, not a fault: no warning
        log.debug("cluster link from %s: %s", source, exc.reason)
    except REFUSED_ERRORS as exc:
        _refused(gate, source, f"no handshake within {HANDSHAKE_TIMEOUT:g} s"
                 if isinstance(exc, trio.TooSlowError) else describe(exc))
    finally:
        slot.leave()
    if peer is None and slot.scope.cancelled_caught:
        _refused(gate, source, f"{gate.limit} connections to this port still authenticating "
                 "(MAX_PENDING_HANDSHAKES): the oldest from this address closed")
    return peer


def peer_host(stream: trio.abc.Stream) -> str:
    """The address a link came from ("?" when it has none: a test's memory stream)."""
    try:
        return str(stream.socket.getpeername()[0])  # type: ignore[attr-defined]
    except (AttributeError, OSError):
        return "?"


def _refused(gate: HandshakeGate, source: str, reason: str) -> None:
    """Anyone who can reach the port can be refused: say what and from where, not once
    per connection (:class:`StrangerRefusals`)."""
    more = gate.refusals.line(source, reason_kind(reason), trio.current_time())
    if more is not None:
        log.warning("cluster link refused: %s (from %s)%s", reason, source, more)
