"""A seed's Raft timers come from ClusterElectionTimeout (cluster/raft_timings.py):
the default is the timers seeds always had, any allowed value is one pysyncobj takes,
and the seed builds its Raft with the configured one."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from pysyncobj import SyncObjConf

import cluster.seed
from cluster.node import GuaranteedNode
from cluster.raft_timings import RaftTimings
from cluster.tooling import free_base_port, member_settings
from migratory.config import load_config


def test_the_default_is_the_timers_seeds_always_had() -> None:
    timings = RaftTimings.for_election_timeout(150)
    assert (timings.election_min, timings.election_max) == (0.15, 0.30)
    assert timings.heartbeat == pytest.approx(0.04)
    assert timings.connection_timeout == pytest.approx(1.0)
    assert timings == RaftTimings()


def test_a_larger_timeout_keeps_the_proportions() -> None:
    timings = RaftTimings.for_election_timeout(600, compaction_entries=500)
    assert (timings.election_min, timings.election_max) == (0.6, 1.2)
    assert timings.heartbeat == pytest.approx(0.16)
    assert timings.connection_timeout == pytest.approx(4.0)
    assert timings.compaction_entries == 500  # (what it does not decide: passed on)


@pytest.mark.parametrize("milliseconds", [100, 150, 1000, 5000])  # the key's range
def test_pysyncobj_takes_every_allowed_timeout(milliseconds: int) -> None:
    """SyncObjConf asserts election_min > 3 heartbeats and a connection timeout of at
    least election_max: a fixed 1 s connection timeout failed from 600 ms on."""
    timings = RaftTimings.for_election_timeout(milliseconds)
    SyncObjConf(
        raftMinTimeout=timings.election_min, raftMaxTimeout=timings.election_max,
        appendEntriesPeriod=timings.heartbeat,
        connectionTimeout=timings.connection_timeout,
        leaderFallbackTimeout=max(1.0, 4 * timings.election_max),
    ).validate()


def _built_timings(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                   **keys: str) -> RaftTimings:
    settings = member_settings(
        0, members=3, seeds=3, mode="Guaranteed", base_port=free_base_port(3),
        password="raft-timings", data_dir=tmp_path / "data",
    )
    node = GuaranteedNode(load_config(overrides={**settings, **keys}, environ={}))
    seed = node.seed
    assert seed is not None
    handed: dict[str, Any] = {}
    monkeypatch.setattr(cluster.seed, "RaftCoordination", lambda **kw: handed.update(kw))
    seed._token = object()  # type: ignore[assignment]  # (what trio gives it at run)
    seed._build_raft()
    timings = handed["timings"]
    assert isinstance(timings, RaftTimings)
    return timings


def test_a_seed_builds_its_raft_with_the_configured_timeout(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    timings = _built_timings(tmp_path, monkeypatch, ClusterElectionTimeout="400",
                             ClusterLogCompactionEntries="1000")
    assert timings == RaftTimings.for_election_timeout(
        400, compaction_entries=1000, compaction_seconds=120, compaction_bytes=64 << 20,
        link_wait=0,  # (a loopback cluster's: cluster/tooling.py)
    )
    assert (timings.election_min, timings.election_max) == (0.4, 0.8)


def test_a_seed_without_the_key_builds_the_default_timers(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    timings = _built_timings(tmp_path, monkeypatch)
    assert (timings.election_min, timings.election_max, timings.heartbeat) == (
        RaftTimings().election_min, RaftTimings().election_max, RaftTimings().heartbeat)
