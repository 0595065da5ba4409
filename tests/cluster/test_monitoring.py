"""What a seed reports to GET /metrics (cluster/monitoring.py), from a stand-in node: its
Raft port's refusals and the last clock offset a seed showed there."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from cluster import raft_slow_disk
from cluster.monitoring import guaranteed_metrics
from cluster.raft_front_server import FrontStatistics
from cluster.raft_slow_disk import SyncTimes
from cluster.raft_status import RaftStatus


def seed(front: FrontStatistics) -> SimpleNamespace:
    counts = SimpleNamespace(refusal_counts=dict, violations={})
    return SimpleNamespace(
        name="m1:9800", is_seed=True, upstream=None,
        replica=SimpleNamespace(applied_clsn=3), stream=SimpleNamespace(followers=set()),
        config=SimpleNamespace(seed_members=[("m1", 9800)], cluster_member_listen=("m1", 9800)),
        seed=SimpleNamespace(raft_status=RaftStatus(front=front), commit_latency=None),
        peers=SimpleNamespace(handshakes=counts, publishes=SimpleNamespace(refused={})),
    )


def test_a_seed_reports_its_raft_fronts_refusals_and_the_last_skew() -> None:
    reported = guaranteed_metrics(seed(FrontStatistics(admitted=2, stale=5, skew=-600.0)))  # type: ignore[arg-type]
    assert dict(reported.raft_front_refused)["stale"] == 5
    assert reported.raft_front_skew == -600.0
    fresh = guaranteed_metrics(seed(FrontStatistics()))  # type: ignore[arg-type]
    assert fresh.raft_front_skew is None  # no seed proved the password yet


def test_a_seed_reports_its_slow_syncs_and_the_one_under_way(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Read from the syncs' timer (cluster/raft_slow_disk.py), not from the Raft thread's
    status: a sync under way is seen while that thread waits in it."""
    now = [50.0]
    syncs = SyncTimes(lambda: now[0])
    monkeypatch.setattr(raft_slow_disk, "SYNCS", syncs)
    syncs.took("/data/raft.journal", 1.5)
    seen = []

    def sync() -> None:
        now[0] += 2.0
        seen.append(guaranteed_metrics(seed(FrontStatistics())))  # type: ignore[arg-type]

    syncs.timed("/data/raft.journal", sync)
    assert (seen[0].raft_slow_syncs, seen[0].raft_sync_waiting) == (1, 2.0)
    after = guaranteed_metrics(seed(FrontStatistics()))  # type: ignore[arg-type]
    assert (after.raft_slow_syncs, after.raft_sync_waiting) == (2, 0.0)
