"""A seed's readiness from its Raft thread's last status: a status that stopped
coming (the Raft thread ended or hangs) is not "ready, with a leader" for ever."""

from __future__ import annotations

import time
from pathlib import Path
from types import SimpleNamespace

from cluster.node import GuaranteedNode
from cluster.raft import RaftStatus
from cluster.seed import RAFT_SILENCE, SeedCoordination
from cluster.tooling import free_base_port, member_settings
from migratory.config import load_config


def seed_with_status(tmp_path: Path, status: RaftStatus) -> SeedCoordination:
    settings = member_settings(
        0, members=3, seeds=3, mode="Guaranteed", base_port=free_base_port(3),
        password="seed-readiness", data_dir=tmp_path / "data",
    )
    node = GuaranteedNode(load_config(overrides=settings, environ={}))
    assert node.seed is not None
    node.seed.raft = SimpleNamespace(snapshot=status)  # type: ignore[assignment]
    return node.seed


def test_a_current_status_with_a_leader_is_ready(tmp_path: Path) -> None:
    status = RaftStatus(state="follower", leader="127.0.0.1:2", ready=True, at=time.monotonic())
    assert seed_with_status(tmp_path, status).not_ready_reason() is None


def test_a_status_the_raft_thread_stopped_sending_is_not_ready(tmp_path: Path) -> None:
    stale = time.monotonic() - RAFT_SILENCE - 1
    status = RaftStatus(state="leader", leader="127.0.0.1:2", ready=True, at=stale)
    reason = seed_with_status(tmp_path, status).not_ready_reason()
    assert reason is not None and "Raft has not reported for" in reason
