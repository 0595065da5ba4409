"""A seed's readiness from its Raft thread's last status: a status that stopped
coming (the Raft thread ended or hangs) is not "ready, with a leader" for ever."""

from __future__ import annotations

import time
from pathlib import Path
from types import SimpleNamespace

import pytest

from cluster import raft_slow_disk
from cluster.node import GuaranteedNode
from cluster.raft import RaftStatus
from cluster.raft_slow_disk import SyncTimes
from cluster.seed import SeedCoordination
from cluster.seed_readiness import BEHIND_SECONDS, RAFT_SILENCE
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


def test_a_raft_thread_waiting_for_the_disk_is_said(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Its status is old because its Raft thread waits in a sync (a slow disk,
    cluster/raft_slow_disk.py): the reason says so, with the file and how long, where it
    said "its thread stopped or hangs"."""
    now = [100.0]
    syncs = SyncTimes(lambda: now[0])
    monkeypatch.setattr(raft_slow_disk, "SYNCS", syncs)
    stale = time.monotonic() - RAFT_SILENCE - 1
    seed = seed_with_status(tmp_path, RaftStatus(state="leader", leader="127.0.0.1:2",
                                                 ready=True, at=stale))
    reasons: list[str | None] = []

    def sync() -> None:
        now[0] += 2.5
        reasons.append(seed.not_ready_reason())

    syncs.timed("/data/raft.journal", sync)
    assert reasons[0] is not None and reasons[0].endswith(
        "(it waits for the disk: a sync of /data/raft.journal for 2.5 s)"), reasons
    after = seed.not_ready_reason()
    assert after is not None and after.endswith("(its thread stopped or hangs)"), after


def test_a_raft_thread_that_died_before_it_caught_up_is_said(tmp_path: Path) -> None:
    """pysyncobj's tick thread raised early (seen: ``time.sleep`` under libfaketime, EINVAL)
    and the member said "member has not caught up with Raft yet" for ever."""
    stale = time.monotonic() - RAFT_SILENCE - 1
    reason = seed_with_status(tmp_path, RaftStatus(ready=False, at=stale)).not_ready_reason()
    assert reason is not None and "Raft has not reported for" in reason, reason
    fresh = seed_with_status(tmp_path, RaftStatus()).not_ready_reason()  # none published yet
    assert fresh == "member has not caught up with Raft yet"


def test_a_seed_that_stopped_applying_what_the_leader_committed_is_not_ready(
    tmp_path: Path,
) -> None:
    now = time.monotonic()
    seed = seed_with_status(tmp_path, RaftStatus(
        state="follower", leader="127.0.0.1:2", ready=True, at=now,
        leader_commit=5000, last_applied=4144,
    ))
    assert seed.not_ready_reason() is None  # behind for a moment: fine
    for later, applied in ((1.0, 4144), (2.0, 4144), (BEHIND_SECONDS + 0.5, 4144)):
        seed.raft = SimpleNamespace(snapshot=RaftStatus(  # type: ignore[assignment]
            state="follower", leader="127.0.0.1:2", ready=True, at=now + later,
            leader_commit=5000 + int(later * 100), last_applied=applied,
        ))
        reason = seed.not_ready_reason()
    assert reason is not None and "behind the Raft leader: applied 4144" in reason
    seed.raft = SimpleNamespace(snapshot=RaftStatus(  # type: ignore[assignment]
        state="follower", leader="127.0.0.1:2", ready=True, at=now + BEHIND_SECONDS + 1,
        leader_commit=5400, last_applied=5390,
    ))
    assert seed.not_ready_reason() is None  # caught up with what was committed 3 s ago


def test_a_seed_whose_hub_got_nothing_of_what_raft_applied_is_not_ready(
    tmp_path: Path,
) -> None:
    """Raft counts a batch applied once the consumer took it, even when it holds it from
    the hub while a dump's numbering decodes (cluster/raft_consumer.py): caught up with
    the leader by Raft's count, its clients receiving nothing. Before, it stayed ready."""
    now = time.monotonic()

    def status(held_for: float) -> RaftStatus:
        return RaftStatus(state="follower", leader="127.0.0.1:2", ready=True, at=now,
                          leader_commit=5000, last_applied=5000, commit_index=5000,
                          held=10, held_since=now - held_for)

    seed = seed_with_status(tmp_path, status(1.0))
    assert seed.not_ready_reason() is None  # held for a moment: fine
    seed.raft = SimpleNamespace(snapshot=status(BEHIND_SECONDS + 0.5))  # type: ignore[assignment]
    reason = seed.not_ready_reason()
    assert reason is not None and "hub is behind its Raft log: 10 committed batches held" in reason


def test_a_seed_whose_loop_has_not_taken_the_batches_handed_to_it_is_not_ready(
    tmp_path: Path,
) -> None:
    now = time.monotonic()
    seed = seed_with_status(tmp_path, RaftStatus(
        state="leader", leader="127.0.0.1:2", ready=True, at=now,
        leader_commit=5000, last_applied=5000,
    ))
    seed._handed.extend([now - BEHIND_SECONDS - 0.5, now - 1.0, now])
    reason = seed.not_ready_reason()
    assert reason is not None and "3 committed batches handed over, not taken" in reason
    seed._handed.popleft()  # taken: the oldest left waits 1 s
    assert seed.not_ready_reason() is None


def test_a_seed_that_keeps_up_under_load_stays_ready(tmp_path: Path) -> None:
    now = time.monotonic()
    seed = seed_with_status(tmp_path, RaftStatus())
    for step in range(20):  # always a few hundred entries behind, never 3 s behind
        seed.raft = SimpleNamespace(snapshot=RaftStatus(  # type: ignore[assignment]
            state="follower", leader="127.0.0.1:2", ready=True, at=now + step * 0.5,
            leader_commit=1000 * step + 300, last_applied=1000 * step,
        ))
        assert seed.not_ready_reason() is None


def test_a_seed_that_cannot_bind_its_raft_port_says_why(tmp_path: Path) -> None:
    error = "cannot listen on 127.0.0.1:9002: Address already in use"
    status = RaftStatus(state="follower", at=time.monotonic(), listen_error=error)
    assert seed_with_status(tmp_path, status).not_ready_reason() == f"Raft {error} (retrying)"


def test_a_seed_that_cannot_load_its_dump_says_so_not_that_it_is_catching_up(
    tmp_path: Path,
) -> None:
    """Before: "member has not caught up with Raft yet", for as long as it ran (a seed
    started on a dump another version wrote applies nothing: cluster/raft_dump_unloadable.py)."""
    why = "Raft: this seed cannot load its own dump (raft.dump): KeyError: 'cached'. ..."
    status = RaftStatus(state="follower", leader="127.0.0.1:2", ready=False,
                        at=time.monotonic(), dump_unloadable=why)
    assert seed_with_status(tmp_path, status).not_ready_reason() == why
