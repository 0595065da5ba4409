"""Seeds keep what they acknowledged through a power loss (cluster/raft_durability.py).

Real pysyncobj nodes (:mod:`raft_sim`) whose crashes are power losses
(:mod:`raft_power`): a crashed node's files come back as the disk held them at their
last sync. pysyncobj alone never syncs, so each power loss took a node back to empty
files; the checks below catch that with the durability patch planted away.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from typing import Any

import pytest
from pysyncobj import journal as pysyncobj_journal
from pysyncobj.journal import MetaStorer
from raft_power import SyncedDisk
from raft_sim import RaftWorld, simulated
from test_raft_safety import LARGE, seeded_search

from cluster import raft_durability
from cluster.raft_data_dir import DamagedRaftData
from cluster.raft_follower import FollowerSafeSyncObj


@pytest.fixture
def disk(monkeypatch: pytest.MonkeyPatch) -> Iterator[SyncedDisk]:
    """Every crash in a RaftWorld is a power loss of that node."""
    synced = SyncedDisk()
    monkeypatch.setattr(raft_durability, "sync_file", synced.sync_file)
    monkeypatch.setattr(raft_durability, "sync_directory", synced.sync_directory)
    crash = RaftWorld.crash

    def power_loss(world: RaftWorld, address: str) -> None:
        crash(world, address)
        synced.power_loss(world.dir, address.replace(":", "_") + ".")

    monkeypatch.setattr(RaftWorld, "crash", power_loss)
    yield synced


def not_synced(monkeypatch: pytest.MonkeyPatch) -> None:
    """The planted bug: the journal is never synced (pysyncobj 0.3.17 as it is)."""
    monkeypatch.setattr(raft_durability, "journal_durable", lambda journal: None)


def commit_then_lose_power_everywhere(world: RaftWorld, commands: int) -> int:
    """Commit ``commands`` commands, every node loses power, all restart and settle;
    returns how many of the acknowledged ones every node applied."""
    for _ in range(20):
        world.step(0.05)
    for i in range(commands):
        leader = world.leader()
        assert leader is not None
        world.submit(leader, b"%05d:command" % i)
        world.step(0.05)
    for _ in range(10):
        world.step(0.05)
    assert len(world.acknowledged) == commands
    for address in world.addresses:
        world.crash(address)
    for address in world.addresses:
        world.restart(address)
    for _ in range(200):
        world.step(0.05)
        if world.converged() and world.leader() is not None:
            break
    return min(
        len(set(world.acknowledged) & {value for _, value in recorder.applied})
        for recorder in world.recorders.values()
    )


@pytest.mark.parametrize("compaction", [False, True], ids=["log", "compaction"])
def test_every_seed_losing_power_at_once_keeps_what_was_acknowledged(
    disk: SyncedDisk, compaction: bool
) -> None:
    kw: dict[str, Any] = (
        {"compaction_entries": 4, "dump_part_bytes": 64, "send_seconds": 0.001}
        if compaction else {}
    )
    with simulated(3, node_class=FollowerSafeSyncObj, **kw) as world:
        assert commit_then_lose_power_everywhere(world, 12) == 12
        assert world.violations() == []
        if compaction:
            assert world.dumps_reloaded >= 1  # a node came back from its synced dump
    assert disk.file_syncs > 0 and disk.directory_syncs > 0


def test_the_check_sees_a_journal_that_is_never_synced(
    disk: SyncedDisk, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The nodes come back with empty journals: refused at start (raft_data_dir.py),
    or, where a node was let start, without the commands."""
    not_synced(monkeypatch)
    with simulated(3, node_class=FollowerSafeSyncObj) as world:
        try:
            kept = commit_then_lose_power_everywhere(world, 12)
        except DamagedRaftData as refused:
            assert "holds no entry at all" in str(refused)
        else:
            assert kept < 12


def test_the_check_sees_a_term_and_vote_file_never_synced(
    disk: SyncedDisk, monkeypatch: pytest.MonkeyPatch
) -> None:
    """pysyncobj's own term-and-vote store (written, renamed, never synced): after the
    power loss the file is there, empty -- refused at start rather than read as "no
    vote" (which would let the seed vote a second time in a term)."""

    def store(storer: MetaStorer, meta: dict[str, Any]) -> None:
        path = storer.getPath()
        with open(path + ".tmp", "wb") as f:
            f.write(pysyncobj_journal.dumps(meta))
        os.replace(path + ".tmp", path)

    monkeypatch.setattr(MetaStorer, "storeMeta", store)
    with simulated(3, node_class=FollowerSafeSyncObj) as world, pytest.raises(
        DamagedRaftData, match=r"\.meta"
    ):
        commit_then_lose_power_everywhere(world, 3)


def answers_before_its_journal_is_synced(monkeypatch: pytest.MonkeyPatch) -> None:
    """The planted bug: a follower answers AppendEntries before its journal is synced
    (it is at its next tick)."""
    synced = raft_durability.journal_durable
    answer = FollowerSafeSyncObj._send_held_answers

    def planted(self: FollowerSafeSyncObj) -> None:
        monkeypatch.setattr(raft_durability, "journal_durable", lambda journal: None)
        try:
            answer(self)
        finally:
            monkeypatch.setattr(raft_durability, "journal_durable", synced)

    monkeypatch.setattr(FollowerSafeSyncObj, "_send_held_answers", planted)


def follower_loses_power_after_answering(world: RaftWorld) -> None:
    """The leader commits a command with one follower's answer; that follower loses
    power before its next tick and the leader's machine does too; the follower comes
    back and, with the third seed (which never got the command), elects a leader."""
    for _ in range(20):
        world.step(0.05)
    leader = world.leader()
    assert leader is not None
    follower, third = (a for a in world.addresses if a != leader)
    world.cut(leader, third)
    world.submit(leader, b"00001:acknowledged")
    world.tick(leader)  # it writes the entry and sends it
    world.deliver(leader, follower, 10)  # the follower writes it and answers
    world.deliver(follower, leader, 10)
    world.tick(leader)  # counted: committed, applied, acknowledged
    assert b"00001:acknowledged" in world.acknowledged
    world.crash(follower)
    world.crash(leader)
    world.heal(leader, third)
    world.restart(follower)
    for _ in range(100):
        world.step(0.05)
        if world.leader() is not None and all(
            b"00001:acknowledged" in {v for _, v in world.recorders[a].applied}
            for a in (follower, third)
        ):
            break


def test_a_follower_keeps_what_it_answered_for_through_a_power_loss(
    disk: SyncedDisk
) -> None:
    """(And its empty-start marker, removed once it caught up, stays removed: back, it
    kept the follower out of the election and the cluster waited for the old leader.)"""
    with simulated(3, node_class=FollowerSafeSyncObj) as world:
        follower_loses_power_after_answering(world)
        assert world.violations() == []
        assert world.leader() is not None
        assert world.converged()  # every seed applied it, at the acknowledged index


def test_the_check_sees_an_answer_before_the_sync(
    disk: SyncedDisk, monkeypatch: pytest.MonkeyPatch
) -> None:
    answers_before_its_journal_is_synced(monkeypatch)
    with simulated(3, node_class=FollowerSafeSyncObj) as world:
        follower_loses_power_after_answering(world)
        assert any("committed by term" in problem for problem in world.violations())


@pytest.mark.parametrize("compaction", [False, True], ids=["log", "compaction"])
def test_seeded_search_with_power_losses_finds_nothing_wrong(
    disk: SyncedDisk, compaction: bool
) -> None:
    """Every crash of the seeded Raft search (test_raft_safety.py) is a power loss."""
    result = seeded_search(FollowerSafeSyncObj, LARGE, runs=60, compaction=compaction)
    assert result.problems == []
    assert disk.losses >= 100
