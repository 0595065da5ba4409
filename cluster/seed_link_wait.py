"""A (re)started seed is not ready until every other seed has a Raft link with it.

Kubernetes' PodDisruptionBudget counts a seed healthy as soon as it is ready; it knows
nothing of ``minReadySeconds``. A seed pod recreated with a new IP (a node drain) was
ready once it linked with *one* other seed, while the third still dialled the old IP
from its DNS cache: the drain could then evict a second seed at once, and the two seeds
left could not reach each other -- no Raft leader until the cache expired (deploy/k8s/
README.md, "Node drains"; tests/deploy/operator_faults.py ``node-drain-two-seeds``).

pysyncobj 0.3.17 makes one connection per pair of seeds: the seed whose address
(``host:port``) sorts higher dials, the other accepts (``TCPTransport._shouldConnect``).
Either side counts the other linked (``isNodeConnected``) only once the key exchange
on that one connection is done, which needs bytes both ways; so a seed that counts
another linked has a working link with it whichever side dialled. A recreated seed
whose peer dials it is linked only once that peer reached its new IP -- the case above.

:class:`LinkWait` keeps a seed not ready until every other seed whose name resolves is
linked with it at the same time, and no longer than ``ClusterSeedLinkWait`` (35 s by
default, :data:`LINK_WAIT`; 0: no wait) after its Raft node was made: a seed that is
down for good (or cut off from this one) then stops being waited for, said once in the
log. A seed whose pod is gone has no DNS record (the seeds' Service publishes not-ready
pods, not pods that do not exist): it is not waited for at all. Only a seed that has
not been ready yet waits: once every seed linked, or the wait ran out, the wait is over
for the life of the process, so a seed that dies later makes no other seed not ready
(that would make the whole StatefulSet not ready when one seed is lost).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable
from typing import Any

from cluster.raft_status import RaftStatus
from migratory.config_cluster import DEFAULT_SEED_LINK_WAIT

__all__ = ["LINK_WAIT", "LinkWait", "unresolved_seeds"]

log = logging.getLogger("migratory.cluster")

LINK_WAIT = float(DEFAULT_SEED_LINK_WAIT)
"""``ClusterSeedLinkWait``'s default: seconds after its Raft node was made that a seed
waits at most for a Raft link with every other seed. 35 s covers the cluster DNS cache
the manifests assume (30 s, the StatefulSet's ``minReadySeconds``; a pod's IP is new
from its start) and a dial to the old IP abandoned (``connectionTimeout``,
cluster/raft_transport.py) and made again. A key, not a constant, because that cache is
the cluster's, not migratory's (a cluster whose DNS caches longer needs more), and
because a loopback cluster has no DNS to wait for: its tests' fixture sets 0, else a
seed restarted while another is down would stay not ready 35 s."""


def unresolved_seeds(
    others: Iterable[Any], linked: Callable[[Any], bool], resolve: Callable[[str], str | None],
) -> tuple[str, ...]:
    """The Raft addresses of the seeds of ``others`` (pysyncobj ``TCPNode``\\ s) not
    ``linked`` whose host name does not ``resolve`` (pysyncobj's cached resolver: at
    most one lookup per name a second)."""
    return tuple(sorted(
        str(node.id) for node in others if not linked(node) and resolve(node.host) is None
    ))


class LinkWait:
    """A seed's wait for a Raft link with every other seed, at most ``limit`` seconds."""

    def __init__(self, limit: float = LINK_WAIT) -> None:
        self.limit = limit  # ClusterSeedLinkWait (0: no wait)
        self.over = limit <= 0

    def reason(self, status: RaftStatus) -> str | None:
        """Why the seed still waits, or None (its wait is over, or about to be)."""
        if self.over:
            return None
        awaited = set(status.seeds) - set(status.unresolved) - set(status.linked)
        if not awaited:
            self.over = True
            return None
        waited = status.at - status.started
        missing = ", ".join(sorted(awaited))
        if waited >= self.limit:
            self.over = True
            log.warning(
                "Raft: seeds %s have not linked with this seed in %.0f s: it no longer waits "
                "for them to be ready (a seed down, or cut off from this one; a node drain "
                "may now take a second seed while they cannot reach this one)",
                missing, waited)
            return None
        # (no running count in it: the member logs each change of its reason)
        return (f"waiting for a Raft link with seeds {missing} (at most {self.limit:g} s "
                "after this seed started: they may still dial its old address)")
