"""The Raft port's listener: pysyncobj's ``TcpServer`` with the front in front of it.

Thin poller glue around the sans-I/O :mod:`cluster.raft_front`; it runs on the Raft
thread, driven by pysyncobj's poller like the ``TcpServer`` it replaces (same
``bind``/``unbind``, same socket options, same ``TcpConnection`` handed to the same
callback). The difference is when: an accepted socket first waits here, registered
with the poller under :meth:`FrontServer._on_preamble_bytes`, which reads at most the
rest of the preamble per ``recv``. pysyncobj sees the socket only once its preamble was
admitted, with the bytes that follow still unread in the kernel. A connection still
waiting after ``UNAUTHENTICATED_SECONDS`` (:meth:`FrontServer.expire`, every tick) or
with a wrong preamble is closed; so is the oldest waiting one when ``MAX_PENDING``
wait. Its memory is one 64-byte buffer per waiting connection. Unlike ``TcpServer`` it
accepts up to ``ACCEPTS_PER_WAKEUP`` connections per poll and listens with a backlog of
``MAX_PENDING``, so a seed's dial does not queue behind an attacker's. An accept that
fails for want of a descriptor (EMFILE...) pauses the listener for a moment, still bound,
and is said once then counted (:class:`migratory.server.exhaustion.Exhaustion`).
"""

from __future__ import annotations

import contextlib
import errno
import logging
import socket
import struct
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from pysyncobj.monotonic import monotonic
from pysyncobj.poller import POLL_EVENT_TYPE
from pysyncobj.tcp_connection import TcpConnection, _getAddrType

from cluster.raft_front import PreambleGate, PreambleReader, Refusal, Verdict
from migratory.server.exhaustion import CAPACITY_ERRNOS, Exhaustion

log = logging.getLogger("migratory.raft")

UNAUTHENTICATED_SECONDS = 3.0
"""An incoming connection has this long to prove the password (and then as long again
to finish pysyncobj's handshake, cluster/raft_transport.py)."""
MAX_PENDING = 128
"""Connections waiting for their preamble; the oldest is closed for a newer one. Also the
listen backlog (TcpServer's 5 was full as soon as 5 peers connected between two ticks)."""
ACCEPTS_PER_WAKEUP = 16
"""TcpServer accepts one connection per poll; a flood of connections then starves a seed."""
_WARN_EVERY = 10.0
SKEW_WARNING = 10.0
"""Seconds a seed's admitted preamble may be off this clock before a warning says so:
past the window (120 s) its preambles are refused, the seed cut off at its next dial."""
SO_TIMESTAMP = 29
"""Linux's ``SO_TIMESTAMP`` (a ``struct timeval``; Python's socket module does not name
it). Set on the listener, every accepted socket inherits it, and each ``recvmsg`` says
when its bytes reached this host (CLOCK_REALTIME): a preamble's skew is measured against
that, not against when it was read. A seed stopped 13 s (SIGSTOP) read, once continued,
preambles its peers had sent during the stop and said "-13.0 s off this clock": its
clock was right, the bytes had waited in the kernel's queue."""
_TIMEVAL = struct.Struct("@ll")
_ANCILLARY = socket.CMSG_SPACE(_TIMEVAL.size)
READ_LATE = 1.0
"""Seconds a preamble waited in the kernel's queue from which a clock warning says so."""
BIND_LOG_EVERY = 30.0
"""Seconds between two log lines about a Raft port that still cannot be bound."""


@dataclass(frozen=True, slots=True)
class FrontStatistics:
    """What the front did since it was built (``SeedLinkTransport.front_statistics``)."""

    admitted: int = 0
    """Connections handed to pysyncobj: the only ones for which a TcpConnection exists."""
    not_a_preamble: int = 0
    bad_mac: int = 0
    stale: int = 0
    replayed: int = 0
    closed_early: int = 0  # the peer closed (or failed) before a whole preamble
    timed_out: int = 0
    evicted: int = 0  # closed for a newer one past MAX_PENDING
    pending: int = 0
    skew: float = 0.0
    """Seconds the clock of the last seed that proved the password (admitted or refused
    as stale) was ahead of this one's: beyond +-120 s its preambles are refused."""
    clock_stepped_back: float = 0.0
    """Seconds this seed's clock last went back, seen by the front (0: never)."""


class _Waiting:
    """One accepted socket waiting for its preamble."""

    __slots__ = ("arrived", "reached", "reader", "sock", "source")

    def __init__(self, sock: socket.socket, arrived: float, source: str) -> None:
        self.sock = sock
        self.arrived = arrived
        self.source = source
        self.reader = PreambleReader()
        self.reached: float | None = None
        """When its first bytes reached this host (CLOCK_REALTIME; None: not known)."""


def _receive_stamped(sock: socket.socket, size: int) -> tuple[bytes, float | None]:
    """Up to ``size`` bytes, and when they reached this host (None: no timestamp)."""
    data, ancillary, _, _ = sock.recvmsg(size, _ANCILLARY)
    for level, kind, value in ancillary:
        if level == socket.SOL_SOCKET and kind == SO_TIMESTAMP and len(value) >= _TIMEVAL.size:
            seconds, micros = _TIMEVAL.unpack_from(value)
            return data, seconds + micros / 1e6
    return data, None


def _stamp_arrivals(listener: socket.socket) -> None:
    """Have the kernel stamp the arrival of what accepted sockets receive (Linux)."""
    if sys.platform.startswith("linux"):
        # (refused: no timestamps, skews measured when read, as before)
        with contextlib.suppress(OSError):
            listener.setsockopt(socket.SOL_SOCKET, SO_TIMESTAMP, 1)


class FrontServer:
    """pysyncobj's ``TcpServer`` interface (``bind``, ``unbind``), behind the front."""

    def __init__(
        self,
        poller: Any,
        host: str,
        port: int,
        on_new_connection: Callable[[TcpConnection], None],
        *,
        gate: PreambleGate,
        send_buffer_size: int,
        recv_buffer_size: int,
        connection_timeout: float,
        clock: Callable[[], float] = time.time,
        arrival_clock: Callable[[], float] = time.time,
    ) -> None:
        """``clock``: the wall clock preambles are judged by; ``arrival_clock``: the one
        the kernel stamps arrivals with (CLOCK_REALTIME), for how long a preamble waited
        in its queue."""
        self._arrival_clock = arrival_clock
        self._poller = poller
        self._host = host
        self._port = int(port)
        self._on_new_connection = on_new_connection
        self._gate = gate
        self._send_buffer_size = send_buffer_size
        self._recv_buffer_size = recv_buffer_size
        self._connection_timeout = connection_timeout
        self._clock = clock
        self._socket: socket.socket | None = None
        self.fileno: int | None = None
        """The listening descriptor; ``None`` when not listening (never bound, or lost)."""
        self._waiting: dict[int, _Waiting] = {}  # fileno -> socket (insertion: oldest first)
        self._counts: dict[str, int] = {}
        self._warned: dict[str, float] = {}  # what was refused -> when it was last logged
        self._unlogged: dict[str, int] = {}  # what was refused -> refusals since then
        self.bind_error: str | None = None
        """Why the last attempt to listen failed (``None``: listening, or not tried yet)."""
        self._bind_failures = 0
        self._bind_logged = 0.0
        self.exhaustion = Exhaustion(log, f"Raft port {host}:{port}")
        """Accepts refused for want of a descriptor (EMFILE...): said once, counted."""
        self._paused_until: float | None = None  # accepting again from then
        self._skew = 0.0  # FrontStatistics.skew
        self._stepped_back = 0.0  # FrontStatistics.clock_stepped_back

    def statistics(self) -> FrontStatistics:
        return FrontStatistics(
            pending=len(self._waiting), skew=self._skew,
            clock_stepped_back=self._stepped_back, **self._counts,
        )

    def _count(self, what: str) -> None:
        self._counts[what] = self._counts.get(what, 0) + 1

    def bind(self) -> None:
        """As ``TcpServer.bind``: raises if the address cannot be bound.

        pysyncobj swallows that error and tries again every ``bindRetryTime``, without a
        word, while the seed holds no election and commits nothing: a Raft port held by
        another process left a seed silently out of its cluster (and a test's submit
        waiting for ever). Here each failure is kept in :attr:`bind_error` (the seed's
        readiness reports it) and logged: the first at once, then every
        :data:`BIND_LOG_EVERY` seconds while it lasts."""
        sock = socket.socket(_getAddrType(self._host), socket.SOCK_STREAM)
        try:
            self._set_options(sock)
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            sock.bind((self._host, self._port))
            sock.listen(MAX_PENDING)  # TcpServer: 5, which a few idle peers fill
            _stamp_arrivals(sock)
        except OSError as exc:
            sock.close()
            self._bind_failed(exc)
            raise
        if self._bind_failures:
            log.warning("Raft: listening on %s:%d at last, after %d failed attempts",
                        self._host, self._port, self._bind_failures)
        self.bind_error, self._bind_failures = None, 0
        self._socket = sock
        self.fileno = sock.fileno()
        self._poller.subscribe(
            self.fileno, self._on_accept, POLL_EVENT_TYPE.READ | POLL_EVENT_TYPE.ERROR
        )

    def _bind_failed(self, exc: OSError) -> None:
        self.bind_error = f"cannot listen on {self._host}:{self._port}: {exc.strerror or exc}"
        self._bind_failures += 1
        now = time.monotonic()
        if self._bind_failures == 1 or now - self._bind_logged >= BIND_LOG_EVERY:
            self._bind_logged = now
            log.error(
                "Raft: %s (attempt %d); this seed takes no part in Raft until it can: "
                "the Raft port is the cluster port + 1, stop what holds it",
                self.bind_error, self._bind_failures,
            )

    def unbind(self) -> None:
        """Stop listening (connections waiting for their preamble stay: ``close_waiting``)."""
        self._paused_until = None
        if self.fileno is not None:
            self._poller.unsubscribe(self.fileno)
            self.fileno = None
        if self._socket is not None:
            self._socket.close()
            self._socket = None

    def close_waiting(self) -> None:
        for fileno in list(self._waiting):
            self._close(fileno)

    def expire(self, now: float) -> None:
        """Close connections still without a whole preamble ``UNAUTHENTICATED_SECONDS``
        after they were accepted (``now``: pysyncobj's ``monotonic()``, the transport's
        clock: CLOCK_MONOTONIC_RAW, not ``time.monotonic``, which NTP slews; the two part
        by a few ppm of the uptime, 0.25 s after 20 h on the box this was written on)."""
        for fileno, waiting in list(self._waiting.items()):
            if now - waiting.arrived <= UNAUTHENTICATED_SECONDS:
                break  # oldest first: the rest are younger
            self._count("timed_out")
            self._note("timed_out", waiting.source,
                       f"no preamble within {UNAUTHENTICATED_SECONDS:g} s")
            self._close(fileno)

    def _set_options(self, sock: socket.socket) -> None:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, self._send_buffer_size)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, self._recv_buffer_size)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        sock.setblocking(False)

    def _on_accept(self, descr: int, event: int) -> None:
        if event & POLL_EVENT_TYPE.READ:
            for _ in range(ACCEPTS_PER_WAKEUP):
                if self._socket is None or not self._accept_one(self._socket):
                    break
        if event & POLL_EVENT_TYPE.ERROR:
            self.unbind()

    def _accept_one(self, listener: socket.socket) -> bool:
        """Accept one connection to wait for its preamble; False when none is left."""
        try:
            sock, peer = listener.accept()
        except (BlockingIOError, InterruptedError):
            return False
        except ConnectionAbortedError:  # the peer gave up before we took it: the next one
            return True
        except OSError as exc:
            if exc.errno in (errno.EAGAIN, errno.EWOULDBLOCK):
                return False
            if exc.errno in CAPACITY_ERRNOS:
                self._pause(exc)
                return False
            log.warning("Raft: accept failed (%s): listening again later", exc)
            self.unbind()  # as TcpServer: the transport binds again
            return False
        self.exhaustion.succeeded()
        try:
            self._set_options(sock)
        except OSError:  # this connection is already gone; the listener is fine
            sock.close()
            self._count("closed_early")
            return True
        if len(self._waiting) >= MAX_PENDING:
            self._count("evicted")
            oldest = next(iter(self._waiting.values()))
            self._note("evicted", oldest.source, f"{MAX_PENDING} connections waiting for "
                       "their preamble (MAX_PENDING): the oldest closed")
            self._close(oldest.sock.fileno())
        fileno = sock.fileno()
        source = str(peer[0]) if isinstance(peer, tuple) and peer else "?"
        self._waiting[fileno] = _Waiting(sock, monotonic(), source)
        self._poller.subscribe(
            fileno, self._on_preamble_bytes, POLL_EVENT_TYPE.READ | POLL_EVENT_TYPE.ERROR
        )
        return True

    def _pause(self, exc: OSError) -> None:
        """No descriptor left (EMFILE...): stop polling the listener for ``retry``
        seconds. It stays bound, its backlog kept: TcpServer unbound it (the connections
        waiting in its backlog reset) and the transport bound it again a second later,
        two warnings per round while the exhaustion lasted; a listener left polled
        would wake every poll, its accept failing at once."""
        self.exhaustion.failed(exc)
        if self.fileno is not None:
            self._poller.unsubscribe(self.fileno)
        self._paused_until = monotonic() + self.exhaustion.retry

    def resume(self, now: float) -> None:
        """Poll the listener again once its pause is over (``now``: pysyncobj's
        ``monotonic()``, as :meth:`expire`; the transport calls this every tick)."""
        if self._paused_until is None or now < self._paused_until:
            return
        self._paused_until = None
        if self.fileno is not None:
            self._poller.subscribe(
                self.fileno, self._on_accept, POLL_EVENT_TYPE.READ | POLL_EVENT_TYPE.ERROR
            )

    def _on_preamble_bytes(self, descr: int, event: int) -> None:
        waiting = self._waiting.get(descr)
        if waiting is None:  # closed earlier in this same poll round
            self._poller.unsubscribe(descr)
            return
        try:
            data, reached = _receive_stamped(waiting.sock, waiting.reader.wanted)
        except (BlockingIOError, InterruptedError):
            return
        except OSError:
            data, reached = b"", None
        if waiting.reached is None:
            waiting.reached = reached
        if not data:
            self._count("closed_early")
            self._close(descr)
            return
        outcome = waiting.reader.receive(data)
        if outcome is None:
            return
        if isinstance(outcome, Refusal):
            self._refuse(descr, Verdict(outcome))
            return
        verdict = self._gate.verify(outcome, self._clock())
        queued = 0.0 if waiting.reached is None else max(
            0.0, self._arrival_clock() - waiting.reached)
        self._heed_clocks(verdict, waiting.source, queued)
        if not verdict.admitted:
            self._refuse(descr, verdict, queued)
            return
        self._admit(descr, waiting.sock)

    def _heed_clocks(self, verdict: Verdict, source: str, queued: float) -> None:
        """Say what a verdict tells of the clocks: this one went back, or a seed's is off
        by more than SKEW_WARNING while still admitted (a stale one: ``_refuse``). The
        skew is the preamble's time against this clock when it arrived, ``queued``
        seconds before it was read (the verdict's is against the clock now)."""
        skew = verdict.skew + queued
        if verdict.refusal not in (Refusal.NOT_A_PREAMBLE, Refusal.BAD_MAC):
            self._skew = skew
        stepped, self._gate.stepped_back = self._gate.stepped_back, 0.0
        if stepped >= 1.0:
            self._stepped_back = stepped
            log.warning(
                "Raft port: this seed's clock went back %.1f s (an NTP step, or set by "
                "hand): preambles are checked against the clock as it is now; if the seeds "
                "still disagree by more than %.0f s they cannot link (check NTP)",
                stepped, self._gate.window)
        if verdict.admitted and abs(skew) > SKEW_WARNING:
            self._note("skew", source, f"its preamble is {skew:+.1f} s off this "
                       f"clock{_read_late(queued)}: past {self._gate.window:.0f} s its "
                       "preambles are refused and it cannot link; check the seeds' clocks "
                       "(NTP)", verb="admitted")

    def _refuse(self, fileno: int, verdict: Verdict, queued: float = 0.0) -> None:
        refusal = verdict.refusal
        assert refusal is not None
        self._count(refusal.name.lower())
        source = self._waiting[fileno].source
        self._close(fileno)
        skew = verdict.skew + queued
        if refusal is Refusal.STALE and abs(skew) <= self._gate.window:
            self._note("stale", source, f"its preamble waited {queued:.1f} s in this "
                       "seed's queue before it was read (this seed stopped or starved "
                       f"meanwhile): past the {self._gate.window:.0f} s limit by then; it "
                       "dials again")
        elif refusal is Refusal.STALE:
            self._note("stale", source, f"its preamble is {skew:+.1f} s off this "
                       f"clock{_read_late(queued)} (the limit is {self._gate.window:.0f} s); "
                       "check the seeds' clocks (NTP)")
        elif refusal is Refusal.REPLAYED:
            self._note("replayed", source, "a preamble replayed")
        elif refusal is Refusal.BAD_MAC:
            self._note("bad_mac", source, "its preamble was made with another password "
                       "(or for another seed)")
        else:
            self._note("not_a_preamble", source, "it sent something other than a seed's "
                       "preamble (not a seed, or a seed of another migratory version)")

    def _note(self, what: str, source: str, why: str, *, verb: str = "refused") -> None:
        """A warning naming why a connection was refused, at most one per kind of
        refusal every ``_WARN_EVERY`` seconds (anyone who reaches the port can make
        refusals, from as many addresses as they like): the next one says how many
        were not logged in between."""
        now = time.monotonic()
        if now - self._warned.get(what, -_WARN_EVERY) < _WARN_EVERY:
            self._unlogged[what] = self._unlogged.get(what, 0) + 1
            return
        self._warned[what] = now
        unlogged = self._unlogged.pop(what, 0)
        more = f" ({unlogged} more {verb} so since the last such line)" if unlogged else ""
        log.warning("Raft port: %s a connection from %s: %s%s", verb, source, why, more)

    def _admit(self, fileno: int, sock: socket.socket) -> None:
        """Hand the socket to pysyncobj as ``TcpServer`` does on accept."""
        del self._waiting[fileno]
        self._poller.unsubscribe(fileno)
        self._count("admitted")
        conn = TcpConnection(
            poller=self._poller,
            socket=sock,
            timeout=self._connection_timeout,
            sendBufferSize=self._send_buffer_size,
            recvBufferSize=self._recv_buffer_size,
            keepalive=None,  # as TcpServer: the transport gives it none
        )
        self._on_new_connection(conn)

    def _close(self, fileno: int) -> None:
        waiting = self._waiting.pop(fileno, None)
        self._poller.unsubscribe(fileno)
        if waiting is not None:
            waiting.sock.close()


def _read_late(queued: float) -> str:
    """What a clock line says of a preamble read ``queued`` seconds after it arrived."""
    return f" when it arrived (read {queued:.1f} s later)" if queued >= READ_LATE else ""
