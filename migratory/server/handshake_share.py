"""TLS handshakes a second, all addresses together, shared fairly between them.

Sans-I/O (no trio, no sockets). ``MaxConnectionRatePerAddress``
(:mod:`migratory.server.front_rate`) stops a ClientHello flood from one address, but a
stranger with N addresses gets N times its rate: from 20 addresses, 20 x 100
handshakes a second were more than the server does, and legitimate TLS clients waited
seconds for theirs (docs/security.md, "A connection flood"). A bound per address
cannot fix that; a bound for all addresses together alone would let the flood take the
whole of it. :class:`HandshakeShare` is both: at most ``rate`` new connections a second
to the encrypted client ports (a token bucket, bursts of one second's worth), shared so
that whatever the number of flooding addresses an address using less than its share
is admitted first.

- **Its share.** Every address group (:func:`~migratory.server.front_rate.address_group`)
  seen within the last :data:`WINDOW` seconds gets an equal share of the rate, and one
  share more is kept for a group not seen yet: with N groups seen, ``rate / (N + 1)``
  a second. What a group was given is counted with an exponential decay of time
  constant :data:`WINDOW` (a group given r a second holds about r).
- **Under its share**: admitted while the bucket holds a token.
- **Over its share**: admitted only while the bucket holds more than half a second's
  worth (:attr:`HandshakeShare.reserve`); the other half is for the groups under their
  share. A flood from any number of addresses takes what the others leave, and the
  bucket stays near half full for a newcomer.

What it guarantees: an address asking for less than ``rate / (N + 1)`` a second (N:
the addresses connecting) is admitted whenever the server is not past ``rate`` for
everybody's shares; one asking for more gets at least that much. Past ``rate``
addresses a second (a botnet of thousands), each share is under one connection a
second and admission is first come within the bucket: that needs a limit in front
(docs/security.md). One address alone (a load balancer's, a NAT's) has the whole rate
(half a second's worth at once, then the refill): then this is a plain bound of TLS
handshakes a second, without fairness (it cannot tell the clients apart).

Users: the encrypted client listeners (``MaxTlsHandshakeRate``,
:mod:`migratory.server.client_accept`) and the cluster link port
(:data:`cluster.link_accept.LINK_HANDSHAKES_PER_SECOND`).

Memory: one record per group seen within the last :data:`WINDOW` seconds (dropped,
oldest first, as new ones come).
"""

from __future__ import annotations

import math
from collections import OrderedDict
from dataclasses import dataclass
from typing import Final

WINDOW: Final = 1.0
"""Seconds a group counts as connecting after its last attempt; the time constant of
what it was given."""


@dataclass(slots=True)
class _Given:
    amount: float  # connections given, decayed to ``at``
    at: float
    seen: float  # its last attempt, given or not


class HandshakeShare:
    """Admission of new connections to the encrypted client ports (0: no limit)."""

    __slots__ = ("_groups", "_last", "_rate", "_tokens", "refused", "refused_over_share")

    def __init__(self, rate: int) -> None:
        if rate < 0:
            raise ValueError("the rate must be 0 (no limit) or more")
        self._rate = rate
        self._tokens = float(rate)
        self._last: float | None = None
        self._groups: OrderedDict[str, _Given] = OrderedDict()
        """group -> what it was given; least recently seen first"""
        self.refused = 0
        self.refused_over_share = 0
        """Of :attr:`refused`, those of a group over its share (the rest: the bucket
        was empty)."""

    def __len__(self) -> int:
        return len(self._groups)

    @property
    def reserve(self) -> float:
        """Tokens only groups under their share may take: half a second's worth."""
        return self._rate / 2

    def share(self) -> float:
        """What a group may be given a second and still count as under its share."""
        return self._rate / (len(self._groups) + 1)

    def take(self, group: str, now: float) -> bool:
        """Whether one more connection from ``group`` may come in at ``now``; counted."""
        rate = self._rate
        if not rate:
            return True
        self._refill(now)
        self._forget(now)
        groups = self._groups
        given = groups.pop(group, None)
        if given is None:
            given = _Given(0.0, now, now)
        elif now > given.at:
            given.amount *= math.exp((given.at - now) / WINDOW)
            given.at = now
        given.seen = now
        under = given.amount < rate * WINDOW / (len(groups) + 2)  # this group and one more
        groups[group] = given
        if self._tokens >= 1.0 and (under or self._tokens >= 1.0 + self.reserve):
            self._tokens -= 1.0
            given.amount += 1.0
            return True
        self.refused += 1
        self.refused_over_share += not under
        return False

    def _refill(self, now: float) -> None:
        last = self._last
        if last is not None and now > last:
            self._tokens = min(float(self._rate), self._tokens + (now - last) * self._rate)
        if last is None or now > last:
            self._last = now

    def _forget(self, now: float) -> None:
        """Drop the groups not seen within the last :data:`WINDOW` seconds (least
        recently seen first: stop at the first that was)."""
        groups = self._groups
        while groups:
            group, given = next(iter(groups.items()))
            if now - given.seen <= WINDOW:
                return
            del groups[group]
