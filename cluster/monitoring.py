"""What a cluster member reports to the server's ``GET /metrics``: its role, Raft
state, links and how far behind each is
(:class:`migratory.server.metric_figures.ClusterMetrics`).

The server never imports the cluster package: a member gives its server a callable
built here (``Server(..., cluster_metrics=...)``), read when Prometheus scrapes.
Nor does this module import the members that use it (:mod:`cluster.node`,
:mod:`cluster.standard`): it names the parts it reads (:class:`GuaranteedMember`,
:class:`StandardMember`), and each member passes itself.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Protocol

from cluster import raft_slow_disk
from migratory.server.metric_figures import ClusterMetrics, PeerLink

if TYPE_CHECKING:
    from cluster.link_accept import HandshakeGate
    from cluster.link_publishes import PeerPublishes
    from cluster.peers import PeerService
    from cluster.raft_front_server import FrontStatistics
    from cluster.replica import Replica
    from cluster.seed import SeedCoordination
    from cluster.stream import CommittedStream
    from cluster.upstream import UpstreamReplication
    from migratory.config import Config


class GuaranteedMember(Protocol):
    """What :func:`guaranteed_metrics` reads of a Guaranteed member (``GuaranteedNode``)."""

    name: str
    is_seed: bool
    config: Config
    replica: Replica
    seed: SeedCoordination | None
    upstream: UpstreamReplication | None
    stream: CommittedStream
    peers: PeerService


class StandardMember(Protocol):
    """What :func:`standard_metrics` reads of a Standard member (``StandardNode``)."""

    name: str
    member_names: frozenset[str]
    connected: set[str]
    handshakes: HandshakeGate
    publishes: PeerPublishes


def _raft_address(address: tuple[str, int]) -> str:
    return f"{address[0]}:{address[1] + 1}"  # a seed's Raft port is its cluster port + 1


_FRONT_REFUSALS = ("stale", "replayed", "bad_mac", "not_a_preamble", "timed_out", "evicted")


def _front_refused(front: FrontStatistics) -> tuple[tuple[str, int], ...]:
    return tuple((reason, getattr(front, reason)) for reason in _FRONT_REFUSALS)


def _front_skew(front: FrontStatistics) -> float | None:
    """The last offset of a seed that proved the password (None: none did yet)."""
    return front.skew if front.admitted + front.stale + front.replayed else None


def guaranteed_metrics(node: GuaranteedMember) -> ClusterMetrics:
    applied = node.replica.applied_clsn
    links: list[PeerLink] = []
    raft = None if node.seed is None else node.seed.raft_status
    disk = None if node.seed is None else raft_slow_disk.SYNCS.statistics()
    if node.seed is not None:
        own = node.config.cluster_member_listen
        linked = set() if raft is None else set(raft.linked)
        for address in node.config.seed_members:
            if address != own:
                peer = _raft_address(address)
                # the link to the leader: Raft entries committed there, not applied here
                lag = None
                if raft is not None and raft.leader == peer:
                    lag = max(raft.leader_commit - raft.last_applied, 0)
                links.append(PeerLink(peer, "raft", peer in linked, lag))
    if node.upstream is not None:
        view = node.upstream.view
        if view.seed is not None:
            lag = None if view.heartbeat_clsn is None else max(view.heartbeat_clsn - applied, 0)
            links.append(PeerLink(view.seed, "upstream", True, lag))
    for follower in sorted(node.stream.followers):
        links.append(PeerLink(follower, "follower", True))
    return ClusterMetrics(
        member=node.name,
        role="seed" if node.is_seed else "non-seed",
        raft_state=None if raft is None else raft.state,
        raft_term=None if raft is None else raft.term,
        raft_commit_index=None if raft is None else raft.commit_index,
        raft_last_applied=None if raft is None else raft.last_applied,
        raft_dump_failures=None if raft is None else raft.dump_failures,
        raft_slow_syncs=None if disk is None else disk.slow_syncs,
        raft_sync_waiting=None if disk is None else disk.waiting,
        link_refusals=tuple(node.peers.handshakes.refusal_counts().items()),
        link_violations=tuple(sorted(node.peers.handshakes.violations.items())),
        link_publishes_refused=tuple(sorted(node.peers.publishes.refused.items())),
        raft_front_refused=() if raft is None else _front_refused(raft.front),
        raft_front_skew=None if raft is None else _front_skew(raft.front),
        raft_subjects=None if raft is None else raft.subjects,
        raft_snapshots=None if raft is None else raft.snapshots,
        applied_clsn=applied,
        links=tuple(links),
        commit_latency=None if node.seed is None else node.seed.commit_latency,
    )


def standard_metrics(node: StandardMember) -> ClusterMetrics:
    links = tuple(
        PeerLink(peer, "forward", peer in node.connected)
        for peer in sorted(node.member_names - {node.name})
    )
    return ClusterMetrics(member=node.name, role="member", links=links,
                          link_refusals=tuple(node.handshakes.refusal_counts().items()),
                          link_violations=tuple(sorted(node.handshakes.violations.items())),
                          link_publishes_refused=tuple(sorted(node.publishes.refused.items())))
