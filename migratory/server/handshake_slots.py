"""How many connections to one listener may still be in their handshake.

Sans-I/O accounting (no trio, no sockets). Anyone who reaches a port can open
connections and never finish the handshake (slowloris: send nothing, or a request a
byte at a time, or stall a TLS handshake); each holds a descriptor and a task until its
handshake deadline. Unbounded, they fill the server: the client ports refused every
legitimate client once the flood reached ``MaxConnections`` (docs/security.md), and a
Raft leader whose cluster port was flooded could not write its journal and stopped.

At most ``limit`` wait at once per listener. One more makes :meth:`PendingHandshakes.add`
name one to close: the oldest waiting, or, while one address holds more than half of
them, the oldest of that address (:meth:`PendingHandshakes.evict`). A real handshake
takes milliseconds, so an attacker must open ``limit`` connections within those
milliseconds to crowd a client out; one attacking address crowds out itself first,
however fast it opens them. (Refusing the newest instead would let a few idle
connections a second lock everyone out for good. Always taking the most crowded address
would let an attacker spread over many addresses make a client dialling twice at once
the most crowded one.)

Users: the client listeners (``MaxPendingHandshakes``, :mod:`migratory.server.limits`)
and the cluster listeners (``cluster/link_accept.py``).
"""

from __future__ import annotations

from collections.abc import Hashable
from dataclasses import dataclass
from typing import Generic, TypeVar

Key = TypeVar("Key", bound=Hashable)


@dataclass(frozen=True, slots=True)
class Evicted(Generic[Key]):
    """A waiting connection to close to make room."""

    key: Key
    address: str
    waiting_from_address: int
    """How many were waiting from that address, this one included."""


class PendingHandshakes(Generic[Key]):
    """The connections of one listener still in their handshake, by address, oldest
    first."""

    def __init__(self, limit: int) -> None:
        if limit < 1:
            raise ValueError("the limit must be at least 1")
        self.limit = limit
        self._address: dict[Key, str] = {}
        self._by_address: dict[str, dict[Key, None]] = {}  # insertion order: oldest first
        self.evicted = 0

    def __len__(self) -> int:
        return len(self._address)

    def __contains__(self, key: object) -> bool:
        return key in self._address

    def add(self, key: Key, address: str, *, make_room: bool = True) -> Evicted[Key] | None:
        """Count ``key`` (a new connection from ``address``) as waiting; past the limit,
        the one to close (it is no longer counted; it may be ``key`` itself), unless
        ``make_room`` is false (one put back: the limit is passed by one)."""
        if key in self._address:
            raise ValueError(f"{key!r} is already waiting")
        self._address[key] = address
        self._by_address.setdefault(address, {})[key] = None
        if len(self._address) <= self.limit or not make_room:
            return None
        return self.evict()

    def evict(self) -> Evicted[Key] | None:
        """The one to close to make room (no longer counted), ``None`` if none waits: the
        oldest of an address holding more than half of ``limit``, else the oldest."""
        if not self._address:
            return None
        crowded = max(self._by_address, key=lambda a: len(self._by_address[a]))
        if len(self._by_address[crowded]) * 2 > self.limit:
            oldest = next(iter(self._by_address[crowded]))
        else:
            oldest = next(iter(self._address))  # insertion order: the oldest of all
        address = self._address[oldest]
        count = len(self._by_address[address])
        self.remove(oldest)
        self.evicted += 1
        return Evicted(oldest, address, count)

    def remove(self, key: Key) -> None:
        """``key`` finished its handshake, failed or closed: no longer waiting
        (idempotent)."""
        address = self._address.pop(key, None)
        if address is None:
            return
        waiting = self._by_address[address]
        del waiting[key]
        if not waiting:
            del self._by_address[address]
