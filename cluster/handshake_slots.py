"""How many connections to one cluster listener may still be proving the password.

Sans-I/O accounting (no trio, no sockets; ``cluster/link_accept.py`` is the adapter).
Anyone who reaches a member's cluster port can open connections and never finish the
handshake; each holds a descriptor (and a task) for up to ``HANDSHAKE_TIMEOUT``.
Unbounded, 2,000 such connections held 2,017 descriptors of a seed, and once they
reached its open-file limit the Raft leader could not write its journal and stopped
(800 idle connections against a limit of 600: the seed exited with status 1).

At most :data:`MAX_PENDING_HANDSHAKES` wait at once per listener. One more makes
:meth:`PendingHandshakes.add` name one to close: the oldest waiting, or, while one
address holds more than half of them, the oldest of that address. A member's handshake
is one round trip and a few HMACs (milliseconds), so an attacker must open that many
connections within those milliseconds to crowd a member out; one attacking address
crowds out itself first, however fast it opens them. (Refusing the newest instead
would let ~26 idle connections a second lock every member out for good. Always taking
the most crowded address would let an attacker spread over many addresses make a
member dialling twice at once the most crowded one.)
"""

from __future__ import annotations

from collections.abc import Hashable
from dataclasses import dataclass
from typing import Final, Generic, TypeVar

MAX_PENDING_HANDSHAKES: Final = 128
"""Connections per cluster listener still proving the password (the Raft port's front
keeps as many, cluster/raft_front_server.py). Both fit in ``FileDescriptorReserve``."""

Key = TypeVar("Key", bound=Hashable)


@dataclass(frozen=True, slots=True)
class Evicted(Generic[Key]):
    """A waiting connection to close to make room."""

    key: Key
    address: str
    waiting_from_address: int
    """How many were waiting from that address, this one included."""


class PendingHandshakes(Generic[Key]):
    """The connections of one listener still authenticating, by address, oldest first."""

    def __init__(self, limit: int = MAX_PENDING_HANDSHAKES) -> None:
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

    def add(self, key: Key, address: str) -> Evicted[Key] | None:
        """Count ``key`` (a new connection from ``address``) as waiting; past the limit,
        the one to close (it is no longer counted; it may be ``key`` itself)."""
        if key in self._address:
            raise ValueError(f"{key!r} is already waiting")
        self._address[key] = address
        self._by_address.setdefault(address, {})[key] = None
        if len(self._address) <= self.limit:
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
        """``key`` authenticated, failed or closed: no longer waiting (idempotent)."""
        address = self._address.pop(key, None)
        if address is None:
            return
        waiting = self._by_address[address]
        del waiting[key]
        if not waiting:
            del self._by_address[address]
