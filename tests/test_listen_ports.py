"""tests/listen_ports.py: each xdist worker's listeners take ports of its own share, below
the clusters' base ports, so no other worker's cluster or listener takes one between the
probe and the bind."""

from __future__ import annotations

import random

import pytest
from listen_ports import CLUSTER_PORTS_FROM, listen_port

from cluster.tooling import PORT_SLICE_ENV, _member_ports, free_base_port


def test_workers_listeners_and_clusters_never_share_a_port(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The CI of d966028a failed test_listener_roles_refuse_publishes_and_protocols with
    "server did not start": a listener's port was picked anywhere from 10000 up, where
    the other workers' clusters take theirs."""
    random.seed(5)
    taken: list[set[int]] = []
    for k in range(3):
        monkeypatch.setenv(PORT_SLICE_ENV, f"{k}/3")
        listeners = {listen_port() for _ in range(200)} | {listen_port(2) + 1 for _ in range(50)}
        assert max(listeners) < CLUSTER_PORTS_FROM
        clusters = {p for _ in range(20) for base in [free_base_port(5)]
                    for i in range(5) for p in _member_ports(base, i)}
        assert listeners.isdisjoint(clusters)
        taken.append(listeners | clusters)
    for a in range(3):
        for b in range(a + 1, 3):
            assert taken[a].isdisjoint(taken[b]), sorted(taken[a] & taken[b])[:5]
