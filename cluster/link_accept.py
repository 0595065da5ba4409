"""Taking a cluster link a peer opened: its handshake, bounded and refused in words.

The trio side of :mod:`cluster.handshake_slots`, shared by the Guaranteed members'
:class:`cluster.peers.PeerService` and the Standard members' listener
(:mod:`cluster.standard`). Each connection's handshake runs in a cancel scope; when
more than ``MAX_PENDING_HANDSHAKES`` are still proving the password, one is cancelled
(the oldest, or the oldest of an address holding more than half) and its connection
refused, logged.

Refusals are logged at warning once a minute per address and kind of reason: the
reasons name what the stranger sent (a frame's size, a member name, a tag), and a
stranger who varies it must not get a line per connection.
"""

from __future__ import annotations

import itertools
import logging
import re
from dataclasses import dataclass, field

import trio

from cluster import link
from cluster.agreement import Repeats
from cluster.handshake_slots import MAX_PENDING_HANDSHAKES, PendingHandshakes
from cluster.link_io import HANDSHAKE_TIMEOUT, Disagreement, LinkChannel, describe

log = logging.getLogger("migratory.cluster")

REFUSED_ERRORS = (link.LinkError, trio.TooSlowError, OSError, EOFError, trio.BrokenResourceError)
"""What a stranger's connection can raise during the handshake (the link is refused)."""

_VARYING = re.compile(r"'(?:[^'\\]|\\.)*'|\"(?:[^\"\\]|\\.)*\"|\d+")


def reason_kind(reason: str) -> str:
    """``reason`` without what the peer chose (quoted names, numbers): the key under
    which a refusal is logged once a minute."""
    return _VARYING.sub("_", reason)


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
    pending: PendingHandshakes[int] = field(init=False)
    _scopes: dict[int, trio.CancelScope] = field(default_factory=dict)
    _keys: itertools.count[int] = field(default_factory=itertools.count)

    def __post_init__(self) -> None:
        self.pending = PendingHandshakes(self.limit)

    @property
    def refused(self) -> int:
        """Connections closed to keep the limit."""
        return self.pending.evicted

    def enter(self, source: str) -> _Slot:
        """A new connection from ``source``; cancels the scope of one that must make room."""
        key = next(self._keys)
        slot = _Slot(key, trio.CancelScope(), self)
        self._scopes[key] = slot.scope
        evicted = self.pending.add(key, source)
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
    (logged). Errors of an authenticated link are the caller's."""
    slot = gate.enter(source)
    peer: str | None = None
    try:
        with slot.scope:
            peer = await channel.handshake(members, authenticated=slot.leave)
    except Disagreement as exc:
        who = f"from {channel.peer} " if channel.peer else ""
        if refusals.first(who, reason_kind(exc.reason), trio.current_time()):
            log.warning("cluster link %srefused: %s", who, exc.reason)
    except REFUSED_ERRORS as exc:
        # anyone who can reach the port can open these: say what and from where,
        # once a minute per address and kind of reason, not once per connection
        reason = (f"no handshake within {HANDSHAKE_TIMEOUT:g} s"
                  if isinstance(exc, trio.TooSlowError) else describe(exc))
        if refusals.first(source, reason_kind(reason), trio.current_time()):
            log.warning("cluster link refused: %s (from %s)", reason, source)
    finally:
        slot.leave()
    if peer is None and slot.scope.cancelled_caught:
        reason = (f"{gate.limit} connections to this port still authenticating "
                  "(MAX_PENDING_HANDSHAKES): the oldest from this address closed")
        if refusals.first(source, reason, trio.current_time()):
            log.warning("cluster link refused: %s (from %s)", reason, source)
    return peer
