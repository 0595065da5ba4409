"""Connection limits: how many clients, from one address, still handshaking, and how
many bytes of incomplete frames all of them may make the server hold.

No I/O: the server asks :meth:`ConnectionLimits.admit` for every accepted socket and
answers a refusal with :func:`refusal_response` (HTTP 503) before closing it. The
total is capped below the open-file limit with a reserve (``FileDescriptorReserve``),
so Raft, cluster links and files always find a descriptor. docs/security.md lists
every limit.
"""

from __future__ import annotations

import resource
from collections import Counter
from typing import Protocol

from migratory.config import Config
from migratory.protocol.http import response


class Counted(Protocol):
    address: str
    handshaking: bool


def open_file_limit() -> int:
    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    return soft if soft != resource.RLIM_INFINITY else 1 << 20


def connection_cap(config: Config, file_limit: int) -> int:
    """``MaxConnections``, or (0) the open-file limit minus ``FileDescriptorReserve``
    (half the limit when the reserve would leave less)."""
    if config.max_connections:
        return config.max_connections
    reserve = config.file_descriptor_reserve
    return max(file_limit - reserve, file_limit // 2)


class ConnectionLimits:
    def __init__(self, config: Config, *, file_limit: int | None = None) -> None:
        self.max_connections = connection_cap(
            config, open_file_limit() if file_limit is None else file_limit
        )
        self._per_address = config.max_connections_per_address
        self._handshakes_per_address = config.max_handshakes_per_address
        self._incomplete_budget = config.incomplete_frame_budget
        self.open = 0
        self.incomplete_bytes = 0
        self._by_address: Counter[str] = Counter()
        self._handshakes: Counter[str] = Counter()

    def admit(self, address: str) -> str | None:
        """Count a new connection from ``address``, or say why it is refused."""
        if self.open >= self.max_connections:
            return f"too many connections ({self.max_connections}, MaxConnections)"
        if self._per_address and self._by_address[address] >= self._per_address:
            return (
                f"too many connections from {address} "
                f"({self._per_address}, MaxConnectionsPerAddress)"
            )
        limit = self._handshakes_per_address
        if limit and self._handshakes[address] >= limit:
            return (
                f"too many handshakes in flight from {address} "
                f"({limit}, MaxHandshakesPerAddress)"
            )
        self.open += 1
        self._by_address[address] += 1
        self._handshakes[address] += 1
        return None

    def handshake_done(self, connection: Counted) -> None:
        """``connection`` finished its handshake (sent ``connect``)."""
        self._decrement(self._handshakes, connection.address)

    def release(self, connection: Counted) -> None:
        """``connection`` closed (call once)."""
        self.open -= 1
        self._decrement(self._by_address, connection.address)
        if connection.handshaking:
            connection.handshaking = False
            self._decrement(self._handshakes, connection.address)

    def hold_incomplete(self, delta: int) -> bool:
        """Add ``delta`` bytes of incomplete frames; False (nothing added) when that would
        pass ``IncompleteFrameBudget``."""
        if delta > 0 and self.incomplete_bytes + delta > self._incomplete_budget:
            return False
        self.incomplete_bytes += delta
        return True

    @staticmethod
    def _decrement(counter: Counter[str], address: str) -> None:
        left = counter[address] - 1
        if left > 0:
            counter[address] = left
        else:
            del counter[address]


def refusal_response(reason: str) -> bytes:
    """What a refused connection is told before it is closed."""
    return response(503, (reason + "\n").encode(), headers=(("Retry-After", "5"),))
