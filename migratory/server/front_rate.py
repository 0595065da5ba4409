"""New connections per second from one address, counted at accept: before any work.

Sans-I/O (no trio, no sockets). A TLS handshake costs the server a key exchange and a
signature (~0.5-1 ms of CPU here) for the bytes of one ClientHello: a stranger who
connects, sends a ClientHello and resets, from one address and as fast as the server
accepts, kept the server's CPU busy with his handshakes and legitimate TLS clients
waited seconds for theirs (docs/security.md, "A connection flood"). No limit counted
in connections held (``MaxHandshakesPerAddress``, ``MaxPendingHandshakes``) sees him: he
holds none. :class:`ConnectionRate` is a token bucket per address, asked at accept: one
over its rate is closed before it costs anything (no TLS, no HTTP, no task).

Per address means per :func:`address_group`: an IPv4 address, or an IPv6 address's
network of ``PerAddressIPv6Prefix`` bits (64: whoever has one address of a /64 has
2^64 of them, one subnet is what one customer gets). The per-address limits of
:mod:`migratory.server.limits` and the cluster ports count by the same group.

Users: the client listeners (``MaxConnectionRatePerAddress``,
:mod:`migratory.server.client_accept`) and the cluster link port
(:data:`cluster.link_accept.LINK_CONNECTIONS_PER_SECOND`).
"""

from __future__ import annotations

from collections import OrderedDict
from ipaddress import IPv6Address, ip_address
from typing import Final

DEFAULT_IPV6_PREFIX: Final = 64
"""Bits of an IPv6 address that name its sender for the per-address limits."""


def address_group(host: str, ipv6_prefix: int = DEFAULT_IPV6_PREFIX) -> str:
    """What per-address limits count ``host`` (an IP address) as: an IPv4 address (also
    one mapped into IPv6, ``::ffff:192.0.2.1``, as a dual-stack listener sees it) as
    itself; an IPv6 address as its ``ipv6_prefix``-bit network (``2001:db8:1:2::/64``;
    itself at 128); anything else (not an IP address) as given."""
    try:
        address = ip_address(host.split("%", 1)[0])  # fe80::1%eth0: the scope is no part
    except ValueError:
        return host
    if not isinstance(address, IPv6Address):
        return str(address)
    mapped = address.ipv4_mapped
    if mapped is not None:
        return str(mapped)
    if ipv6_prefix >= 128:
        return str(address)
    drop = 128 - ipv6_prefix
    network = IPv6Address(int(address) >> drop << drop)
    return f"{network}/{ipv6_prefix}"


class ConnectionRate:
    """A token bucket per address group: ``rate`` new connections a second, bursts of
    one second's worth (0: no limit).

    Memory: a bucket full again is the same as none, so the buckets not taken from for
    a second (``burst / rate``) are dropped, oldest first, as new ones come: at most as
    many as groups connected within the last second."""

    __slots__ = ("_buckets", "_rate", "refused")

    def __init__(self, rate: int) -> None:
        if rate < 0:
            raise ValueError("the rate must be 0 (no limit) or more")
        self._rate = rate
        self._buckets: OrderedDict[str, tuple[float, float]] = OrderedDict()
        """group -> (tokens, when last taken from), least recently taken first"""
        self.refused = 0

    def __len__(self) -> int:
        return len(self._buckets)

    def take(self, group: str, now: float) -> bool:
        """Whether one more connection from ``group`` may come in at ``now``; counted."""
        rate = self._rate
        if not rate:
            return True
        buckets = self._buckets
        self._forget_full(now)
        last = buckets.pop(group, None)
        tokens = float(rate) if last is None else min(rate, last[0] + (now - last[1]) * rate)
        if tokens < 1.0:
            buckets[group] = (tokens, now)
            self.refused += 1
            return False
        buckets[group] = (tokens - 1.0, now)
        return True

    def _forget_full(self, now: float) -> None:
        """Drop the buckets full again by ``now`` (least recently taken first: stop at
        the first that is not)."""
        buckets = self._buckets
        while buckets:
            group, (tokens, last) = next(iter(buckets.items()))
            if tokens + (now - last) * self._rate < self._rate:
                return
            del buckets[group]
