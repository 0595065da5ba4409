"""The Raft links between seeds: pysyncobj's TCP transport with a time limit on dialling.

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
"""

from __future__ import annotations

import logging
import select
from typing import Any

from pysyncobj.monotonic import monotonic
from pysyncobj.tcp_connection import CONNECTION_STATE
from pysyncobj.transport import TCPTransport

log = logging.getLogger("migratory.raft")


class SeedLinkTransport(TCPTransport):  # type: ignore[misc]
    """``TCPTransport`` whose connection attempts end after ``conf.connectionTimeout``."""

    # pysyncobj's state this class reads (annotations only, for mypy)
    _syncObj: Any
    _connections: dict[Any, Any]  # node -> TcpConnection
    _lastConnectAttempt: dict[Any, float]  # node -> monotonic time of the last dial

    def _onTick(self) -> None:
        """Runs on every Raft tick (pysyncobj registers it in ``__init__``)."""
        super()._onTick()
        self.abandon_stalled_dials(monotonic())

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
