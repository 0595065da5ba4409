"""The Raft links between seeds: pysyncobj's TCP transport with a time limit on dialling,
and a Raft port that trusts no unauthenticated byte.

pysyncobj 0.3.17 gives up on a link only when it reads from it or sends on it. A
connection attempt has no time limit at all, and while one is pending the transport
never dials that seed again: it neither resolves the name anew nor tries another
address. That is what kept a StatefulSet's seeds apart for 30-130 s after a seed pod
was recreated (tests/deploy/seed_restarts.py): the pod comes back under the same name
with a new IP; the seeds that dial it noticed the old pod leave and dialled again at
once -- the old IP (the name did not resolve in between, and pysyncobj's resolver then
keeps the last address). Nothing answers a SYN sent to a vanished pod's IP while the
dialler's neighbour table still knows its MAC, and Linux retries the SYN for about
127 s (``tcp_syn_retries = 6``). Two seeds dialling like that when the third left were
connected to no one, and pysyncobj holds no election while connected to no one: no
leader until a SYN timed out.

:class:`SeedLinkTransport` abandons a connection attempt that has not completed within
the configured ``connectionTimeout`` (the time pysyncobj already allows a silent
established link); pysyncobj then dials again at once, resolving the name again
(``dnsCacheTime``), and reaches the new pod. A dial the kernel has already completed
is left alone even when the Raft thread comes to it late. tests/cluster/
test_raft_transport.py pins pysyncobj's unlimited wait and shows this transport's limit.

The Raft port trusts no unauthenticated byte. pysyncobj alone reads whatever anyone
sends into one growing buffer (60 MB of garbage, re-copied on every read, starved the
Raft thread until leadership changed), keeps a connection that sends nothing open for
ever (300 idle ones held 300 descriptors), and, if its listening socket fails once
(EMFILE), never listens again. Here:

- the listener is :class:`cluster.raft_front_server.FrontServer`, not pysyncobj's
  ``TcpServer``: it accepts a connection, reads exactly the :mod:`cluster.raft_front`
  preamble (64 bytes, never more: what follows stays in the kernel) and only if the
  preamble proves the cluster password builds pysyncobj's ``TcpConnection`` for the
  socket, as ``TcpServer`` would. It closes a connection whose preamble is wrong (at
  its first wrong label byte), that is not complete within ``UNAUTHENTICATED_SECONDS``,
  or, past ``MAX_PENDING`` connections waiting, the oldest. A dialling seed writes its
  preamble before any byte of pysyncobj's (:meth:`SeedLinkTransport._onOutgoingConnected`),
  so every seed must run this code (as for the cipher, cluster/raft_cipher.py);
- a connection past the front is still *unidentified* until pysyncobj's own handshake
  (the first message decrypts, then names a seed): it too is closed after
  ``UNAUTHENTICATED_SECONDS``, or once more than ``MAX_UNAUTHENTICATED_BYTES`` wait in
  its buffer;
- a lost listener listens again (tests/cluster/test_raft_port.py, test_raft_front_port.py);
  with no descriptor left (EMFILE) the listener pauses instead (FrontServer) and a dial
  is put off to the next ``connectionRetryTime``: each said once, then counted, where
  pysyncobj's tick ended in a traceback ("failed _onTick in _autoTickThread") at every
  dial, the rest of its tick (timeouts, keepalives) skipped.

Idle links are kept alive. pysyncobj checks a link's silence only when it sends on it:
a link that has read nothing for ``connectionTimeout`` is dropped *instead of* sending.
Two followers never talk while a leader lives, so when it died the first follower to
stand for election dropped its link to the other with its vote request, and the other
timed out into a candidacy of its own: a split vote, a second election, at every leader
failover (0.4-1.2 s instead of ~0.2 s; cluster_failover.py). Every seed now sends
``KEEPALIVE`` on each identified link a few times per ``connectionTimeout``
(:meth:`SeedLinkTransport.keep_links_alive`); the receiver ignores it
(cluster/raft_follower.py). A silent peer still loses its link after
``connectionTimeout``, as before (tests/cluster/test_raft_keepalive.py).
"""

from __future__ import annotations

import logging
import os
import select
import time
from typing import Any

from pysyncobj.dns_resolver import globalDnsResolver
from pysyncobj.monotonic import monotonic
from pysyncobj.tcp_connection import CONNECTION_STATE
from pysyncobj.transport import TCPTransport

from cluster import raft_name_lookups
from cluster.raft_front import (
    NONCE_SIZE,
    WINDOW_SECONDS,
    PreambleGate,
    derive_key,
    encode_preamble,
)
from cluster.raft_front_server import UNAUTHENTICATED_SECONDS, FrontServer, FrontStatistics
from migratory.server.exhaustion import CAPACITY_ERRNOS, Exhaustion

__all__ = [
    "KEEPALIVE", "MAX_UNAUTHENTICATED_BYTES", "UNAUTHENTICATED_SECONDS", "SeedLinkTransport",
]

log = logging.getLogger("migratory.raft")

MAX_UNAUTHENTICATED_BYTES = 65_536
"""An authenticated peer's first messages (a sealed random key, its address) are ~200 B."""
KEEPALIVE = "migratory_keepalive"
"""The type of the message that keeps an idle Raft link alive (no other content)."""
KEEPALIVES_PER_TIMEOUT = 4
"""Keepalives sent on each idle link per ``connectionTimeout``."""
UNANSWERED_LOG_EVERY = 60.0
"""Seconds between two lines about one seed closing this seed's dials unanswered."""


class SeedLinkTransport(TCPTransport):  # type: ignore[misc]
    """``TCPTransport`` behind the front, whose connection attempts end after
    ``conf.connectionTimeout``."""

    # pysyncobj's state this class reads (annotations only, for mypy)
    _syncObj: Any
    _connections: dict[Any, Any]  # node -> TcpConnection
    _lastConnectAttempt: dict[Any, float]  # node -> monotonic time of the last dial
    _unknownConnections: set[Any]  # incoming connections not identified yet
    _server: FrontServer | None  # pysyncobj's TcpServer, replaced (_createServer)
    _selfNode: Any  # pysyncobj's TCPNode of this seed (None: a read-only node)
    _ready: bool  # pysyncobj: the listener is bound (it never unsets it)

    def __init__(self, syncObj: Any, selfNode: Any, otherNodes: Any) -> None:
        self._arrived: dict[Any, float] = {}  # unidentified connection -> when
        self._keepalive_sent = 0.0  # when keep_links_alive last sent
        self._unanswered: dict[Any, Any] = {}  # dial past connect, not answered -> node
        self._unanswered_logged: dict[str, tuple[float, int]] = {}  # seed -> (when, since)
        self._refused_by: set[str] = set()  # seeds whose front closed our last dial unanswered
        self._destroyed = False
        # before TCPTransport.__init__: it creates the server
        self._front_key = derive_key(syncObj.conf.password or "")
        self.dial_exhaustion = Exhaustion(log, "Raft", retry=syncObj.conf.connectionRetryTime)
        """Dials refused for want of a descriptor (EMFILE...): said once, counted."""
        raft_name_lookups.install()  # pysyncobj's lines about a name that does not resolve
        super().__init__(syncObj, selfNode, otherNodes)

    def _createServer(self) -> None:
        """pysyncobj's ``TCPTransport._createServer`` (same address rules), building a
        :class:`FrontServer` in place of its ``TcpServer``."""
        conf = self._syncObj.conf
        if conf.bindAddress is not None:
            host, port = conf.bindAddress.rsplit(":", 1)
        else:
            host, port = self._selfNode.address.rsplit(":", 1)
            host = "::" if ":" in host else "0.0.0.0"
        if host != "0.0.0.0":
            host = globalDnsResolver().resolve(host)
        gate = PreambleGate(self._front_key, address=self._selfNode.address)
        self._server = FrontServer(
            self._syncObj._poller, host, int(port), self._onNewIncomingConnection,
            gate=gate, send_buffer_size=conf.sendBufferSize,
            recv_buffer_size=conf.recvBufferSize, connection_timeout=conf.connectionTimeout,
        )

    def front_statistics(self) -> FrontStatistics:
        return FrontStatistics() if self._server is None else self._server.statistics()

    def refused_by(self) -> tuple[str, ...]:
        """The seeds whose front closed this seed's last dial unanswered (the seed's
        readiness names them: most likely their clocks and this one's disagree)."""
        return tuple(sorted(self._refused_by))

    def listen_error(self) -> str | None:
        """Why the Raft port is not listening, while it is not (``None`` otherwise)."""
        if self._ready or self._server is None:
            return None
        return self._server.bind_error

    def _onOutgoingConnected(self, conn: Any) -> None:
        """The dial completed: the preamble goes first, before pysyncobj's first message
        (which ``TCPTransport._onOutgoingConnected`` queues and sends)."""
        node = self._connToNode(conn)
        if node is not None:
            preamble = encode_preamble(
                self._front_key, target=node.address, now=time.time(),
                nonce=os.urandom(NONCE_SIZE),
            )
            # connect() emptied the buffer; nothing is queued on a dial not yet complete
            conn._TcpConnection__writeBuffer = preamble + conn._TcpConnection__writeBuffer
            self._unanswered[conn] = node
        super()._onOutgoingConnected(conn)

    def _onOutgoingMessageReceived(self, conn: Any, message: Any) -> None:
        """The dialled seed answered (its sealed key): its front admitted the preamble."""
        node = self._unanswered.pop(conn, None)
        if node is not None:
            self._refused_by.discard(str(node.address))
        super()._onOutgoingMessageReceived(conn, message)

    def _onDisconnected(self, conn: Any) -> None:
        node = self._unanswered.pop(conn, None)
        if node is not None and not self._destroyed:
            self._refused_by.add(str(node.address))
            self._dial_unanswered(str(node.address))
        super()._onDisconnected(conn)

    def _dial_unanswered(self, seed: str) -> None:
        """A dialled seed closed the connection without a word: its front refused the
        preamble. Only the refusing seed knew why (its log, GET /cluster raft_front); a
        seed whose clock was 10 minutes off said nothing of it in its own log."""
        now = monotonic()
        logged, since = self._unanswered_logged.get(seed, (None, 0))
        if logged is not None and now - logged < UNANSWERED_LOG_EVERY:
            self._unanswered_logged[seed] = (logged, since + 1)
            return
        self._unanswered_logged[seed] = (now, 0)
        more = f" ({since} more times since the last such line)" if since else ""
        log.warning(
            "Raft: seed %s closed this seed's Raft connection without answering%s: its Raft "
            "port refused this seed's preamble -- most likely the two clocks are more than "
            "%.0f s apart (check NTP on both), else another ClusterPassword or migratory "
            "version; that seed's log names the reason", seed, more, WINDOW_SECONDS)

    def _onTick(self) -> None:
        """Runs on every Raft tick (pysyncobj registers it in ``__init__``)."""
        if self._destroyed:
            return
        self._listen_again_if_lost()
        super()._onTick()
        now = monotonic()
        self.abandon_stalled_dials(now)
        self.drop_unauthenticated(now)
        self.keep_links_alive(now)
        if self._server is not None:
            self._server.expire(now)
            self._server.resume(now)

    def _connectIfNecessarySingle(self, node: Any) -> bool:
        """pysyncobj's, but a dial with no descriptor left (``socket()``: EMFILE) is
        counted and put off to the next ``connectionRetryTime``, not raised out of the
        tick (its traceback at ERROR every dial, the rest of the tick not run)."""
        attempted = self._lastConnectAttempt.get(node)
        try:
            dialled: bool = super()._connectIfNecessarySingle(node)
        except OSError as exc:
            if exc.errno not in CAPACITY_ERRNOS:
                raise
            self.dial_exhaustion.failed(exc, f"dial seed {node.address}")
            return False
        if self._lastConnectAttempt.get(node) != attempted:  # a socket was made
            self.dial_exhaustion.succeeded()
        return dialled

    def destroy(self) -> None:
        """Every link and the port closed; once (a Raft node that stopped closes them
        when it stops, then again as the member closes it: cluster/raft.py)."""
        if self._destroyed:
            return
        self._destroyed = True
        super().destroy()
        if self._server is not None:
            self._server.close_waiting()

    def _onNewIncomingConnection(self, conn: Any) -> None:
        super()._onNewIncomingConnection(conn)
        self._arrived[conn] = monotonic()
        read = conn._TcpConnection__processRead
        unknown = self._unknownConnections

        def bounded_read() -> bool:
            more: bool = read()
            if conn in unknown and len(conn._TcpConnection__readBuffer) > MAX_UNAUTHENTICATED_BYTES:
                log.warning("Raft: an unidentified peer sent too much: disconnected")
                conn.disconnect()
                return False
            return more

        # pysyncobj's read loop calls self.__processRead: the instance attribute wins
        conn._TcpConnection__processRead = bounded_read

    def drop_unauthenticated(self, now: float) -> None:
        """Close incoming connections past the front but still unidentified (pysyncobj's
        handshake not done) UNAUTHENTICATED_SECONDS after they passed it."""
        for conn, arrived in list(self._arrived.items()):
            if conn not in self._unknownConnections:
                del self._arrived[conn]
            elif now - arrived > UNAUTHENTICATED_SECONDS:
                del self._arrived[conn]
                log.info("Raft: an unidentified connection timed out: disconnected")
                conn.disconnect()

    def keep_links_alive(self, now: float) -> None:
        """Send KEEPALIVE on every identified link, KEEPALIVES_PER_TIMEOUT times per
        ``connectionTimeout`` (see the module's docstring)."""
        every = float(self._syncObj.conf.connectionTimeout) / KEEPALIVES_PER_TIMEOUT
        if now - self._keepalive_sent < every:
            return
        self._keepalive_sent = now
        for node in list(self._connections):
            if self._syncObj.isNodeConnected(node):  # past the key exchange
                self.send(node, {"type": KEEPALIVE})

    def _listen_again_if_lost(self) -> None:
        """pysyncobj unbinds its listener when ``accept`` fails (EMFILE) and, having set
        ``_ready`` once, never binds it again: bind again (after bindRetryTime)."""
        server = self._server
        if self._ready and server is not None and server.fileno is None:
            log.warning("Raft: the listening socket was lost: listening again")
            self._ready = False

    def abandon_stalled_dials(self, now: float) -> None:
        limit = float(self._syncObj.conf.connectionTimeout)
        for node, connection in list(self._connections.items()):
            if connection.state != CONNECTION_STATE.CONNECTING:
                continue
            dialled = self._lastConnectAttempt.get(node)
            if dialled is None or now - dialled <= limit or _answered(connection):
                continue
            log.debug("Raft: %s did not answer in %.1f s: dialling again", node, limit)
            # pysyncobj's disconnect handler dials again at once, with a fresh lookup
            connection.disconnect()


def _answered(connection: Any) -> bool:
    """The kernel has finished the dial (connected or refused) and pysyncobj's poller
    has not handled it yet (a Raft thread kept off the CPU): leave it to the poller."""
    fileno = connection.fileno()
    if fileno is None:
        return False
    poller = select.poll()
    poller.register(fileno, select.POLLOUT)
    return bool(poller.poll(0))
