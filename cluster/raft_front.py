"""The Raft port's front door: the preamble a seed sends before any byte of pysyncobj.

Sans-I/O: bytes in, verdict out; no sockets, no pysyncobj (``cluster/raft_transport.py``
is the adapter). A seed that dials another seed's Raft port writes one fixed-size
preamble first; the listening seed reads exactly that many bytes and hands the socket
to pysyncobj only if the preamble proves the cluster password. Nothing an
unauthenticated peer sends ever reaches pysyncobj's buffers, framing or unpickler.

Wire (:data:`PREAMBLE_SIZE` = 64 bytes)::

    label (8) | nonce (16) | timestamp, ms since the epoch, signed big-endian (8) | mac (32)
    mac = HMAC-SHA256(key, label | nonce | timestamp | target), target = the
          listening seed's Raft address as every seed names it ("host:port")
    key = PBKDF2-SHA256(cluster password, salt "migratory raft front v1", 100,000)

The target in the MAC stops a preamble sent to one seed from opening another. The
listener admits a preamble whose timestamp is within :data:`WINDOW_SECONDS` of its own
clock and whose nonce it has not admitted before: it remembers the admitted nonces of
the window, at most :data:`MAX_REMEMBERED_NONCES`; when that is full it forgets the
oldest and refuses every timestamp up to the forgotten one (so a forgotten nonce is not
admitted again). The cost: the seeds' clocks must agree within the window (NTP); a seed
whose clock is off says so in the log (:attr:`Verdict.skew`).

**The listener's clock steps back** (an NTP correction of every seed, a node's clock set
by hand): the floor moves back with it (:attr:`PreambleGate.stepped_back`). Left where
it was, it refused every preamble stamped before it as a replay -- after every seed's
clock went back an hour, no Raft link could form for that hour (a seed restarted then
could not rejoin). The price: a preamble recorded up to the step's size before the step
may be admitted once more within the window, the exposure of a seed restarted within the
window (docs/security.md): such a peer meets the AES-GCM seal behind the front.

The check runs in the order label, MAC, time, nonce: only a holder of the password (or
a replay of one) gets past the MAC, so a refusal for time or replay is worth a warning.
"""

from __future__ import annotations

import enum
import functools
import hashlib
import heapq
import hmac
import struct
from dataclasses import dataclass

from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.kdf.pbkdf2 import PBKDF2HMAC

LABEL = b"MGRAFT\x00\x01"
NONCE_SIZE = 16
_TIMESTAMP = struct.Struct("!q")
MAC_SIZE = 32
PREAMBLE_SIZE = len(LABEL) + NONCE_SIZE + _TIMESTAMP.size + MAC_SIZE
_SIGNED = len(LABEL) + NONCE_SIZE + _TIMESTAMP.size
WINDOW_SECONDS = 120.0
"""How far a preamble's timestamp may be from the listener's clock, either way."""
MAX_REMEMBERED_NONCES = 16_384
"""Admitted nonces kept against replay (a few seeds redialling every 0.3 s for the
whole window make ~800 per peer)."""
_SALT = b"migratory raft front v1"
_PBKDF2_ITERATIONS = 100_000


class Refusal(enum.Enum):
    """Why a preamble was refused."""

    NOT_A_PREAMBLE = "not a preamble"  # the label is wrong: not a seed of ours at all
    BAD_MAC = "wrong password or wrong seed"
    STALE = "timestamp outside the window"
    REPLAYED = "nonce seen before"


@dataclass(frozen=True, slots=True)
class Verdict:
    refusal: Refusal | None
    skew: float = 0.0
    """Seconds the sender's clock is ahead of ours (set once the MAC is good)."""

    @property
    def admitted(self) -> bool:
        return self.refusal is None


ADMITTED = Verdict(None)


@functools.lru_cache(maxsize=4)
def derive_key(password: str) -> bytes:
    """The front's HMAC key (cached: every seed of a test process derives the same)."""
    if not password:
        raise ValueError("the Raft front needs the cluster password")
    kdf = PBKDF2HMAC(
        algorithm=hashes.SHA256(), length=32, salt=_SALT, iterations=_PBKDF2_ITERATIONS
    )
    return kdf.derive(password.encode())


def _mac(key: bytes, signed: bytes, target: str) -> bytes:
    return hmac.new(key, signed + target.encode("utf-8"), hashlib.sha256).digest()


def encode_preamble(key: bytes, *, target: str, now: float, nonce: bytes) -> bytes:
    """The preamble a seed writes first on a connection to ``target``'s Raft port."""
    if len(nonce) != NONCE_SIZE:
        raise ValueError(f"the nonce must be {NONCE_SIZE} bytes")
    signed = LABEL + nonce + _TIMESTAMP.pack(int(now * 1000))
    return signed + _mac(key, signed, target)


class PreambleReader:
    """One incoming connection's preamble, as its bytes arrive.

    Read at most :attr:`wanted` bytes from the socket and :meth:`receive` them: the bytes
    after the preamble stay in the kernel for pysyncobj.
    """

    def __init__(self) -> None:
        self._received = bytearray()

    @property
    def wanted(self) -> int:
        return PREAMBLE_SIZE - len(self._received)

    def receive(self, data: bytes) -> bytes | Refusal | None:
        """The whole preamble once complete, :attr:`Refusal.NOT_A_PREAMBLE` as soon as the
        label is wrong, ``None`` while more is wanted."""
        if not data or len(data) > self.wanted:
            raise ValueError(f"receive 1 to {self.wanted} bytes, not {len(data)}")
        start = len(self._received)
        self._received += data
        if start < len(LABEL) and not LABEL.startswith(self._received[: len(LABEL)]):
            return Refusal.NOT_A_PREAMBLE
        if self.wanted == 0:
            return bytes(self._received)
        return None


class PreambleGate:
    """The listening seed's check of preambles: the password, the time, and replays."""

    def __init__(
        self,
        key: bytes,
        *,
        address: str,
        window: float = WINDOW_SECONDS,
        max_nonces: int = MAX_REMEMBERED_NONCES,
    ) -> None:
        if max_nonces < 1:
            raise ValueError("max_nonces must be at least 1")
        self._key = key
        self.address = address
        self.window = window
        self._window_ms = int(window * 1000)
        self._max_nonces = max_nonces
        self._seen: set[bytes] = set()
        self._by_time: list[tuple[int, bytes]] = []  # heap of (timestamp ms, nonce)
        self._floor_ms = -(2**63)  # timestamps up to this are refused: their nonces are forgotten
        self._latest_ms = -(2**63)  # the latest reading of the listener's clock
        self.stepped_back = 0.0
        """Seconds the listener's clock last went back (0: never); the caller logs it and
        sets it back to 0."""

    @property
    def remembered(self) -> int:
        return len(self._seen)

    def verify(self, preamble: bytes, now: float) -> Verdict:
        """Admit or refuse one complete preamble; ``now`` is the wall clock in seconds."""
        if len(preamble) != PREAMBLE_SIZE or not preamble.startswith(LABEL):
            return Verdict(Refusal.NOT_A_PREAMBLE)
        signed, mac = preamble[:_SIGNED], preamble[_SIGNED:]
        if not hmac.compare_digest(mac, _mac(self._key, signed, self.address)):
            return Verdict(Refusal.BAD_MAC)
        (sent_ms,) = _TIMESTAMP.unpack_from(preamble, len(LABEL) + NONCE_SIZE)
        now_ms = int(now * 1000)
        self._follow_clock(now_ms)
        skew = (sent_ms - now_ms) / 1000
        if abs(sent_ms - now_ms) > self._window_ms:
            return Verdict(Refusal.STALE, skew)
        self._forget_before(now_ms - self._window_ms)
        nonce = bytes(preamble[len(LABEL) : len(LABEL) + NONCE_SIZE])
        if nonce in self._seen or sent_ms <= self._floor_ms:
            return Verdict(Refusal.REPLAYED, skew)
        if len(self._seen) >= self._max_nonces:
            self._forget_oldest()
            if sent_ms <= self._floor_ms:
                return Verdict(Refusal.REPLAYED, skew)
        self._seen.add(nonce)
        heapq.heappush(self._by_time, (sent_ms, nonce))
        return Verdict(None, skew)

    def _follow_clock(self, now_ms: int) -> None:
        """The floor was set by the clock before a step back: move it back by the step.
        The nonces stay remembered (and refused) until the clock passes their timestamps
        by the window again."""
        step_ms = self._latest_ms - now_ms
        self._latest_ms = now_ms
        if step_ms <= 0:
            return
        self.stepped_back = step_ms / 1000
        self._floor_ms = max(self._floor_ms - step_ms, -(2**63))

    def _forget_before(self, oldest_ms: int) -> None:
        """Nonces older than the window (their timestamps are stale anyway; the floor
        keeps them refused even if this clock is set back)."""
        while self._by_time and self._by_time[0][0] < oldest_ms:
            self._forget_oldest()

    def _forget_oldest(self) -> None:
        forgotten_ms, forgotten = heapq.heappop(self._by_time)
        self._seen.discard(forgotten)
        self._floor_ms = max(self._floor_ms, forgotten_ms)
