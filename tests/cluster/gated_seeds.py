"""A local cluster whose seeds are reached through gates (:mod:`tcp_gate`): each seed
binds ``ClusterMemberBind`` elsewhere and is reached through a gate on its
``ClusterMemberListen`` port (cluster links) and one on port + 1 (Raft), so that a test
can close, reset or stall the way to one seed. Used by the lagging failover and resume
tests and the fault combinations."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

from cluster_fixture import LocalCluster
from tcp_gate import TcpGate

SEEDS = range(3)


def behind_gates(cluster: LocalCluster) -> dict[int, list[TcpGate]]:
    """Each seed's two gates, ``[links, raft]``, by seed index (before it starts)."""
    gates = {}
    for i in SEEDS:
        listen = int(cluster.settings[i]["ClusterMemberListen"].rsplit(":", 1)[1])
        bind = cluster.base + 2000 + 10 * i
        cluster.settings[i]["ClusterMemberBind"] = f"127.0.0.1:{bind}"
        gates[i] = [TcpGate(listen, bind), TcpGate(listen + 1, bind + 1)]
    return gates


@contextmanager
def started_behind_gates(cluster: LocalCluster) -> Iterator[dict[int, list[TcpGate]]]:
    """The cluster's seeds behind gates, every member started and ready; on the way out
    the members stopped and every gate shut down."""
    gates = behind_gates(cluster)
    try:
        cluster.start_all()
        cluster.wait_ready(timeout=40)
        yield gates
    finally:
        cluster.stop()
        for pair in gates.values():
            for gate in pair:
                gate.shutdown()


def seed_index(cluster: LocalCluster, name: str | None) -> int | None:
    """The index of the seed whose ``ClusterMemberListen`` is ``name`` (a member's
    ``replicating_from``), None for no seed."""
    return next((i for i in SEEDS if cluster.settings[i]["ClusterMemberListen"] == name), None)
