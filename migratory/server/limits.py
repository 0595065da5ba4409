"""Connection limits: how many clients, from one address, still handshaking, and how
many bytes of incomplete frames all of them may make the server hold.

No I/O: the server asks :meth:`ConnectionLimits.admit` for every accepted socket and
answers a refusal with :func:`refusal_bytes` before closing it: HTTP 503 on a native
port, CONNACK 3 on an MQTT port, nothing on a TLS port (docs/mqtt.md). The
total is capped below the open-file limit with a reserve (``FileDescriptorReserve``),
so Raft, cluster links and files always find a descriptor. docs/security.md lists
every limit.

Connections still in their handshake (TLS, HTTP request or WebSocket upgrade, `connect`,
MQTT CONNECT) are the ones a stranger can hold for nothing (slowloris): at most
``MaxPendingHandshakes`` per listener (:mod:`migratory.server.handshake_slots`), and when
the server is full (``MaxConnections``) a newcomer closes the oldest of them instead of
being refused (:meth:`ConnectionLimits.enter`). Only a server full of clients that did
finish their handshake refuses newcomers.
"""

from __future__ import annotations

import resource
from collections import Counter
from collections.abc import Hashable
from dataclasses import dataclass, field
from typing import Final, Protocol

from migratory.config import Config
from migratory.protocol import mqtt
from migratory.protocol.http import response
from migratory.protocol.mqtt_encode import encode_packet
from migratory.server.handshake_slots import Evicted, PendingHandshakes

LOG_EVERY: Final = 60.0
"""Seconds between two log lines of one kind of refusal (:class:`RefusalLog`)."""


class Counted(Protocol):
    address: str
    handshaking: bool

    @property
    def busy(self) -> bool: ...  # a request or answers wait: never closed for room

    def __hash__(self) -> int: ...  # by identity: a key of PendingHandshakes


@dataclass(frozen=True, slots=True)
class Refusal:
    """Why a new connection is refused: ``kind`` names the limit (the label of
    ``migratory_connections_refused_total``), ``reason`` says it to the client."""

    kind: str
    reason: str


@dataclass(frozen=True, slots=True)
class Eviction:
    """A connection still in its handshake to close for a newcomer, and which limit
    (``kind``, at ``limit``) the newcomer would have passed."""

    kind: str
    limit: int
    evicted: Evicted[Counted]


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
        self._pending_limit = config.max_pending_handshakes
        self._pending: dict[Hashable, PendingHandshakes[Counted]] = {}  # by listener

    @property
    def pending_handshakes(self) -> int:
        """Connections counted by :meth:`enter` still in their handshake (every listener)."""
        return sum(len(pending) for pending in self._pending.values())

    def admit(self, address: str) -> Refusal | None:
        """Count a new connection from ``address``, or say why it is refused. A full
        server still admits it while some connection is in its handshake: :meth:`enter`
        then names one to close."""
        if self.open >= self.max_connections and not self.pending_handshakes:
            return Refusal("MaxConnections",
                           f"too many connections ({self.max_connections}, MaxConnections)")
        if self._per_address and self._by_address[address] >= self._per_address:
            return Refusal("MaxConnectionsPerAddress",
                           f"too many connections from {address} "
                           f"({self._per_address}, MaxConnectionsPerAddress)")
        limit = self._handshakes_per_address
        if limit and self._handshakes[address] >= limit:
            return Refusal("MaxHandshakesPerAddress",
                           f"too many handshakes in flight from {address} "
                           f"({limit}, MaxHandshakesPerAddress)")
        self.open += 1
        self._by_address[address] += 1
        self._handshakes[address] += 1
        return None

    def enter(self, connection: Counted, listener: Hashable) -> Eviction | None:
        """Count ``connection`` (admitted) as in its handshake on ``listener``; the one to
        close to make room (maybe ``connection`` itself), no longer counted here: past
        ``MaxPendingHandshakes`` on that listener, the oldest of its handshakes (of an
        address holding more than half, if any); past ``MaxConnections``, the same rule
        on the listener with the most handshakes."""
        pending = self._pending.get(listener)
        if pending is None:
            pending = self._pending[listener] = PendingHandshakes(self._pending_limit)
        evicted = _not_busy(pending, pending.add(connection, connection.address))
        if evicted is not None:
            return Eviction("MaxPendingHandshakes", self._pending_limit, evicted)
        if self.open > self.max_connections:
            fullest = max(self._pending.values(), key=len)
            evicted = _not_busy(fullest, fullest.evict())
            if evicted is not None:
                return Eviction("MaxConnections", self.max_connections, evicted)
        return None

    def handshake_done(self, connection: Counted) -> None:
        """``connection`` finished its handshake (sent ``connect``) or had an HTTP request
        answered: no longer counted in ``MaxHandshakesPerAddress``. An HTTP keep-alive
        connection may still be closed to make room until it becomes a client session
        (:meth:`connected`): one request per ``HandshakeTimeout`` would hold it for ever."""
        self._decrement(self._handshakes, connection.address)

    def connected(self, connection: Counted) -> None:
        """``connection`` is a client session (`connect`, MQTT CONNECT, an SSE stream):
        never closed to make room."""
        self._leave(connection)

    def release(self, connection: Counted) -> None:
        """``connection`` closed (call once)."""
        self.open -= 1
        self._decrement(self._by_address, connection.address)
        if connection.handshaking:
            connection.handshaking = False
            self._decrement(self._handshakes, connection.address)
        self._leave(connection)

    def _leave(self, connection: Counted) -> None:
        for pending in self._pending.values():  # one per listener: a few
            pending.remove(connection)

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


BUSY_TRIES: Final = 8
"""Busy connections passed over to find one to close before giving up (the listener is
then over its bound by one until one leaves)."""


def _not_busy(
    pending: PendingHandshakes[Counted], evicted: Evicted[Counted] | None
) -> Evicted[Counted] | None:
    """``evicted``, or, if its request waits for its answer, the next one by the same
    rule (the busy one counted again, as the newest); ``None`` after :data:`BUSY_TRIES`."""
    for attempt in range(BUSY_TRIES + 1):
        if evicted is None or not evicted.key.busy:
            return evicted
        pending.evicted -= 1  # not closed after all: back, as the newest
        pending.add(evicted.key, evicted.address, make_room=False)
        if attempt == BUSY_TRIES:
            break
        evicted = pending.evict()
    return None


def refusal_response(reason: str) -> bytes:
    """What a refused connection of a native port is told before it is closed."""
    return response(503, (reason + "\n").encode(), headers=(("Retry-After", "5"),))


MQTT_REFUSAL: Final = encode_packet(mqtt.Connack(False, mqtt.REFUSED_SERVER_UNAVAILABLE))
"""What a refused connection of a ListenMqtt port is told: CONNACK 3, server
unavailable, sent without reading its CONNECT (MQTT 3.1.1 only: nothing in the CONNECT
changes the answer). paho then reports return code 3; a 503 there was a bad packet."""


def refusal_bytes(reason: str, *, mqtt_port: bool, encrypted: bool) -> bytes | None:
    """What a refused connection is told before it is closed, ``None``: nothing (reset).
    A TLS port says nothing: bytes in clear are a bad record to a TLS client, and a TLS
    handshake is the work the limit spares (as MaxConnectionRatePerAddress)."""
    if encrypted:
        return None
    return MQTT_REFUSAL if mqtt_port else refusal_response(reason)


@dataclass
class RefusalLog:
    """Which refusals to log: one line per kind every ``every`` seconds, the next line
    of a kind saying how many were not logged (a flood of strangers must not flood the
    log; the counts are in ``migratory_connections_refused_total``)."""

    every: float = LOG_EVERY
    _kinds: dict[str, tuple[float, int]] = field(default_factory=dict)
    """kind -> (time of its last line, refusals not logged since)"""

    def line(self, kind: str, now: float) -> int | None:
        """``None``: no line now; else how many of this kind went unlogged before it."""
        last = self._kinds.get(kind)
        if last is not None and now - last[0] < self.every:
            self._kinds[kind] = (last[0], last[1] + 1)
            return None
        self._kinds[kind] = (now, 0)
        return 0 if last is None else last[1]
