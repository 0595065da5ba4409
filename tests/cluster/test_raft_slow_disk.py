"""A seed whose disk is slow: its syncs take 1-3 s for 10 s (cluster/raft_slow_disk.py).

Real pysyncobj nodes (:mod:`raft_sim`) whose syncs stall them (:mod:`raft_stalls`):
the Raft thread of a slow seed stops in each sync while the others go on. Each case
publishes through every seed all along (a client on each) and checks what a user
expects: every publish answered, nothing acknowledged lost or renumbered, a leader
that commits, and the slow disk said once per episode (with how long the sync took).
"""

from __future__ import annotations

import contextlib
import itertools
import logging
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import pytest
from raft_sim import RaftWorld, simulated
from raft_stalls import StalledDisk

from cluster import raft_durability, raft_slow_disk
from cluster.raft_follower import FollowerSafeSyncObj
from cluster.raft_slow_disk import QUIET_SECONDS, SLOW_SYNC_SECONDS, SyncTimes

EPISODE = 10.0  # seconds the disk is slow
STEP = 0.05
PUBLISH_EVERY = 0.25  # seconds between two publishes at each seed



class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


# --- the episode, alone ------------------------------------------------------------------


def test_an_episode_of_slow_syncs_is_said_once_with_how_long_then_its_end(
    caplog: pytest.LogCaptureFixture,
) -> None:
    clock = Clock()
    times = SyncTimes(clock)
    caplog.set_level(logging.INFO, "migratory.raft")
    for seconds in (0.0003, 1.5, 0.0002, 2.75, 0.4):
        times.took("/data/raft.journal", seconds)
        clock.now += 1.0
    lines = [r.getMessage() for r in caplog.records]
    assert len(lines) == 1 and "a sync of /data/raft.journal took 1.50 s" in lines[0]
    assert times.statistics().slow and times.statistics().longest == 2.75
    clock.now += QUIET_SECONDS
    times.check(clock.now)
    assert "the disk is fast again: 3 sync(s) in 3.0 s took 0.1 s or more, the longest " \
           "2.75 s (/data/raft.journal)" in caplog.records[-1].getMessage()
    assert len(caplog.records) == 2
    times.took("/data/raft.journal.meta", 1.0)  # a new episode: said again
    assert len(caplog.records) == 3
    stats = times.statistics()
    assert (stats.slow_syncs, stats.episodes, stats.slow) == (4, 2, True)


def test_a_sync_under_way_is_seen_from_another_thread_while_it_waits() -> None:
    clock = Clock()
    times = SyncTimes(clock)
    seen: list[Any] = []

    def sync() -> None:
        clock.now += 2.5
        seen.append(times.statistics())

    times.timed("/data/raft.journal", sync)
    assert (seen[0].waiting, seen[0].waiting_on) == (2.5, "/data/raft.journal")
    after = times.statistics()
    assert (after.waiting, after.waiting_on, after.slow_syncs) == (0.0, None, 1)


def test_fast_syncs_say_nothing(caplog: pytest.LogCaptureFixture) -> None:
    times = SyncTimes(Clock())
    caplog.set_level(logging.INFO, "migratory.raft")
    for _ in range(100):
        times.took("/data/raft.journal", SLOW_SYNC_SECONDS / 2)
    assert caplog.records == [] and times.statistics().slow_syncs == 0


# --- real nodes --------------------------------------------------------------------------


@dataclass
class Publishes:
    """One command submitted at every seed each step: when, where, and its answer."""

    world: RaftWorld
    tag: bytes = b"e"  # (values unique across two of them in one world)
    submitted: dict[bytes, tuple[str, float]] = field(default_factory=dict)
    answered: dict[bytes, tuple[int, float]] = field(default_factory=dict)  # error, when

    def submit_everywhere(self, but: str | None = None) -> None:
        for address in list(self.world.nodes):
            if address == but:
                continue
            value = b"%s%06d:%s" % (self.tag, len(self.submitted), address.encode())
            self.submitted[value] = (address, self.world.clock.now)

            def done(result: Any, error: int, value: bytes = value) -> None:
                self.answered[value] = (error, self.world.clock.now)
                if error == 0:
                    self.world.acknowledged[value] = result

            self.world.recorders[address].put(value, callback=done)

    def unanswered(self) -> list[bytes]:
        return [value for value in self.submitted if value not in self.answered]

    def longest_without_a_commit(self, since: float, until: float) -> float:
        """The longest span in [since, until] in which no publish was acknowledged."""
        times = sorted(when for error, when in self.answered.values()
                       if error == 0 and since <= when <= until)
        edges = [since, *times, until]
        return max(b - a for a, b in itertools.pairwise(edges))

    def slowest_answer(self, at: str) -> float:
        return max(self.answered[value][1] - when
                   for value, (address, when) in self.submitted.items() if address == at)


@dataclass
class Episode:
    publishes: Publishes
    began: float
    ended: float
    quiet: float  # when the clients stopped publishing
    leaders: list[tuple[str | None, int]]  # (leader, its term), each change


@pytest.fixture
def syncs(monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> SyncTimes:
    times = SyncTimes()
    monkeypatch.setattr(raft_slow_disk, "SYNCS", times)
    caplog.set_level(logging.INFO, "migratory.raft")
    return times


@contextlib.contextmanager
def slow_disks(
    monkeypatch: pytest.MonkeyPatch, syncs: SyncTimes, stalls: tuple[float, float] = (1.0, 3.0),
    **kw: Any,
) -> Iterator[tuple[RaftWorld, StalledDisk]]:
    """Three seeds whose syncs each stall ``stalls`` seconds where slow."""
    with simulated(3, node_class=FollowerSafeSyncObj, **kw) as world:
        disk = StalledDisk(world, seconds=stalls)
        monkeypatch.setattr(raft_durability, "sync_file", disk.sync_file)
        monkeypatch.setattr(raft_durability, "sync_directory", disk.sync_directory)
        syncs.clock = world.clock
        for _ in range(20):
            disk.step(STEP)
        assert world.leader() is not None
        yield world, disk


def slow_episode(world: RaftWorld, disk: StalledDisk, slow: list[str],
                 after: float = 2.0) -> Episode:
    """Publish through every seed while ``slow``'s syncs stall them for EPISODE seconds,
    then ``after`` seconds more; then let every answer come."""
    publishes = Publishes(world)
    began = world.clock.now
    disk.slow_for(slow, EPISODE)
    leaders: list[tuple[str | None, int]] = []

    def clients() -> None:  # (stalls included: the leader and its term noted then too)
        publishes.submit_everywhere()
        leader = world.leader()
        now = (leader, 0 if leader is None else world.nodes[leader].raftCurrentTerm)
        if not leaders or leaders[-1] != now:
            leaders.append(now)

    disk.clients(PUBLISH_EVERY, clients)
    while world.clock.now < began + EPISODE + after:
        disk.step(STEP)
    disk.clients(STEP, lambda: None)
    quiet = world.clock.now
    for _ in range(40):
        disk.step(STEP)
    return Episode(publishes, began, began + EPISODE, quiet, leaders)


def said(caplog: pytest.LogCaptureFixture, text: str) -> list[str]:
    return [r.getMessage() for r in caplog.records if text in r.getMessage()]


def check_episode(world: RaftWorld, disk: StalledDisk, episode: Episode,
                  caplog: pytest.LogCaptureFixture, slow: list[str]) -> None:
    """Every publish answered; every acknowledged one applied everywhere at the index
    it was acknowledged at, no two at one index (raft_sim's checks); each slow seed
    stalled again and again, and the slow disk was said once (its end comes
    QUIET_SECONDS after its last slow sync: test_an_episode_of_slow_syncs_...)."""
    assert episode.publishes.unanswered() == []
    assert world.violations() == []
    assert world.converged()
    assert all(disk.stalls.get(address) for address in slow), disk.stalls
    assert sum(len(disk.stalls[address]) for address in slow) >= 3, disk.stalls
    assert len(said(caplog, "the disk is slow: a sync of")) == 1


def test_a_leaders_slow_disk_moves_the_lead_and_the_others_commit(
    monkeypatch: pytest.MonkeyPatch, syncs: SyncTimes, caplog: pytest.LogCaptureFixture
) -> None:
    """(a) The leader stuck in its syncs sends no heartbeat: a follower is elected (the
    other's pre-vote granted: it hears no leader either) and commits; the old leader,
    awake, steps down (a higher term, or leaderFallbackTimeout). Its own clients'
    publishes wait for it (the server's publish timeout answers them)."""
    with slow_disks(monkeypatch, syncs) as (world, disk):
        slow = world.leader()
        assert slow is not None
        episode = slow_episode(world, disk, [slow])
        check_episode(world, disk, episode, caplog, [slow])
        assert {leader for leader, _ in episode.leaders} - {slow, None}, episode.leaders
        publishes = episode.publishes
        assert publishes.longest_without_a_commit(episode.began, episode.ended) < 1.0
        fast = [a for a in world.addresses if a != slow]
        assert max(publishes.slowest_answer(a) for a in fast) < 1.0


def test_a_followers_slow_disk_changes_nothing_for_the_others(
    monkeypatch: pytest.MonkeyPatch, syncs: SyncTimes, caplog: pytest.LogCaptureFixture
) -> None:
    """(b) The leader commits with the other follower. The slow one, awake after each
    stall, finds its election timeout long passed and asks for pre-votes: refused (the
    others hear the leader), so the leader and its term stay -- pysyncobj alone would
    stand at once and depose it (test_the_check_sees_a_slow_follower_...)."""
    with slow_disks(monkeypatch, syncs) as (world, disk):
        leader = world.leader()
        assert leader is not None
        term = world.nodes[leader].raftCurrentTerm
        slow = next(a for a in world.addresses if a != leader)
        episode = slow_episode(world, disk, [slow])
        check_episode(world, disk, episode, caplog, [slow])
        assert episode.leaders == [(leader, term)]
        publishes = episode.publishes
        assert publishes.longest_without_a_commit(episode.began, episode.ended) < 0.5
        fast = [a for a in world.addresses if a != slow]
        assert max(publishes.slowest_answer(a) for a in fast) < 0.5


@pytest.mark.parametrize("which", ["leader and a follower", "both followers"])
def test_two_slow_disks_of_three_slow_the_commits_and_lose_nothing(
    monkeypatch: pytest.MonkeyPatch, syncs: SyncTimes, caplog: pytest.LogCaptureFixture,
    which: str,
) -> None:
    """(c) No majority has a fast disk: a commit needs a slow seed's sync (the leader's
    own, or a follower's answer), an election a slow seed's vote (its term and vote
    synced first), and a leader that hears no majority for leaderFallbackTimeout (1.2 s
    by default) steps down -- a slow follower's answer comes after it: here nothing
    committed in the whole episode, the publishes answered when it ended (the server's
    publish timeout answers them sooner: PUBLISH_FAILED). Never wrong, and a leader that
    commits at once once the disks are back."""
    with slow_disks(monkeypatch, syncs) as (world, disk):
        leader = world.leader()
        assert leader is not None
        followers = [a for a in world.addresses if a != leader]
        slow = [leader, followers[0]] if which == "leader and a follower" else followers
        episode = slow_episode(world, disk, slow, after=5.0)
        check_episode(world, disk, episode, caplog, slow)
        publishes = episode.publishes
        back = episode.ended + disk.seconds[1]  # (a stall begun before the end ends then)
        assert publishes.longest_without_a_commit(back, episode.quiet) < 1.0
        assert world.leader() is not None


COMPACTING = {"compaction_entries": 20, "dump_part_bytes": 256, "send_seconds": 0.0005}


def test_a_slow_seed_compacting_its_log(
    monkeypatch: pytest.MonkeyPatch, syncs: SyncTimes, caplog: pytest.LogCaptureFixture
) -> None:
    """(d) Every seed compacts every 20 entries: a follower's dump written and synced
    (here in the tick; pysyncobj's forked writer syncs in the child, where the Raft
    thread does not wait), then its journal trimmed, synced and renamed, its directory
    synced: each a stall of its Raft thread (of 0.1-0.3 s: more syncs in the episode).

    With stalls of 0.2-0.5 s the slow follower spent the whole episode in its journal's
    syncs and compacted only once its disk was fast again; the check below had been met
    by the leader's dump it received (renamed over its own, then kept its log against),
    which 0553ccc no longer writes: the stall asserted is its own compaction's now."""
    with slow_disks(monkeypatch, syncs, (0.1, 0.3), **COMPACTING) as (world, disk):
        leader = world.leader()
        assert leader is not None
        slow = next(a for a in world.addresses if a != leader)
        episode = slow_episode(world, disk, [slow])
        check_episode(world, disk, episode, caplog, [slow])
        assert any(name.endswith((".dump.tmp", ".trim")) for name in disk.stalled_on), \
            disk.stalled_on


def test_a_slow_follower_taking_the_leaders_dump(
    monkeypatch: pytest.MonkeyPatch, syncs: SyncTimes, caplog: pytest.LogCaptureFixture
) -> None:
    """(d) A follower cut off while the others compacted past its log gets the leader's
    dump when the link is back -- with its disk slow: each part written, the whole synced
    before it replaces the follower's, its directory synced, each a stall."""
    with slow_disks(monkeypatch, syncs, **COMPACTING) as (world, disk):
        leader = world.leader()
        assert leader is not None
        behind = next(a for a in world.addresses if a != leader)
        for other in world.addresses:
            world.cut(behind, other)
        publishes = Publishes(world, b"p")
        for _ in range(30):  # (its own clients would wait for a leader: raft_forward.py)
            publishes.submit_everywhere(but=behind)
            disk.step(STEP)
        installed = world.dumps_installed
        for other in world.addresses:
            world.heal(behind, other)
        episode = slow_episode(world, disk, [behind])
        assert world.dumps_installed > installed
        assert any(".dump" in name for name in disk.stalled_on), disk.stalled_on
        assert publishes.unanswered() == []
        check_episode(world, disk, episode, caplog, [behind])


def test_the_check_sees_a_slow_follower_that_stands_without_pre_vote(
    monkeypatch: pytest.MonkeyPatch, syncs: SyncTimes
) -> None:
    """Pre-vote planted away (pysyncobj's own rule): the slow follower, awake after a
    stall, raises its term and deposes the leader the others hear, which must be elected
    again (here term 1 to 3) -- the check of (b) sees it."""
    monkeypatch.setattr(FollowerSafeSyncObj, "pre_vote_enabled", False)
    with slow_disks(monkeypatch, syncs) as (world, disk):
        leader = world.leader()
        assert leader is not None
        term = world.nodes[leader].raftCurrentTerm
        slow = next(a for a in world.addresses if a != leader)
        episode = slow_episode(world, disk, [slow])
        assert episode.leaders != [(leader, term)]
        assert max(t for _, t in episode.leaders) > term + 1, episode.leaders
