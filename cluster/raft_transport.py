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

An incoming connection is *unauthenticated* until it has proved the cluster password
(its first message decrypts) and named a seed. pysyncobj keeps such a connection open
as long as it sends nothing (300 idle ones held 300 descriptors), reads whatever it
sends into one growing buffer (60 MB of garbage, re-copied on every read, starved the
Raft thread until leadership changed), and, if its listening socket fails once (EMFILE),
never listens again. This transport closes an unauthenticated connection after
``UNAUTHENTICATED_SECONDS``, or as soon as it has sent more than
``MAX_UNAUTHENTICATED_BYTES``, and listens again when its listener was lost
(tests/cluster/test_raft_port.py).
"""

from __future__ import annotations

import logging
import select
from typing import Any

from pysyncobj.monotonic import monotonic
from pysyncobj.tcp_connection import CONNECTION_STATE
from pysyncobj.transport import TCPTransport

log = logging.getLogger("migratory.raft")

UNAUTHENTICATED_SECONDS = 3.0
MAX_UNAUTHENTICATED_BYTES = 65_536
"""An authenticated peer's first messages (a sealed random key, its address) are ~200 B."""


class SeedLinkTransport(TCPTransport):  # type: ignore[misc]
    """``TCPTransport`` whose connection attempts end after ``conf.connectionTimeout``."""

    # pysyncobj's state this class reads (annotations only, for mypy)
    _syncObj: Any
    _connections: dict[Any, Any]  # node -> TcpConnection
    _lastConnectAttempt: dict[Any, float]  # node -> monotonic time of the last dial
    _unknownConnections: set[Any]  # incoming connections not identified yet
    _server: Any  # pysyncobj's TcpServer
    _ready: bool  # pysyncobj: the listener is bound (it never unsets it)

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        self._arrived: dict[Any, float] = {}  # unauthenticated connection -> when
        self._destroyed = False
        super().__init__(*args, **kwargs)

    def _onTick(self) -> None:
        """Runs on every Raft tick (pysyncobj registers it in ``__init__``)."""
        if self._destroyed:
            return
        self._listen_again_if_lost()
        super()._onTick()
        now = monotonic()
        self.abandon_stalled_dials(now)
        self.drop_unauthenticated(now)

    def destroy(self) -> None:
        self._destroyed = True
        super().destroy()

    def _onNewIncomingConnection(self, conn: Any) -> None:
        super()._onNewIncomingConnection(conn)
        self._arrived[conn] = monotonic()
        read = conn._TcpConnection__processRead
        unknown = self._unknownConnections

        def bounded_read() -> bool:
            more: bool = read()
            if conn in unknown and len(conn._TcpConnection__readBuffer) > MAX_UNAUTHENTICATED_BYTES:
                log.warning("Raft: an unauthenticated peer sent too much: disconnected")
                conn.disconnect()
                return False
            return more

        # pysyncobj's read loop calls self.__processRead: the instance attribute wins
        conn._TcpConnection__processRead = bounded_read

    def drop_unauthenticated(self, now: float) -> None:
        """Close incoming connections still unauthenticated after UNAUTHENTICATED_SECONDS."""
        for conn, arrived in list(self._arrived.items()):
            if conn not in self._unknownConnections:
                del self._arrived[conn]
            elif now - arrived > UNAUTHENTICATED_SECONDS:
                del self._arrived[conn]
                log.info("Raft: an unauthenticated connection timed out: disconnected")
                conn.disconnect()

    def _listen_again_if_lost(self) -> None:
        """pysyncobj unbinds its listener when ``accept`` fails (EMFILE) and, having set
        ``_ready`` once, never binds it again: bind again (after bindRetryTime)."""
        server = self._server
        if self._ready and server is not None and server._TcpServer__fileno is None:
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
