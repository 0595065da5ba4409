"""A seed's activity for the idle collector (migratory/server/gc_pauses.py): the
publishes non-seeds forward to it count, as its own clients' do, while their commits
are late; so do the Raft entries it takes (a follower's from its leader, a leader's
commands)."""

from __future__ import annotations

import functools
import gc
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import trio
import trio.testing
from pysyncobj import SyncObjConf
from test_commit_window import FakeRaft, node_at, raft_built
from test_raft_follower import Unconnected, append

from cluster.coordination import PublishRequest
from cluster.raft import CoordinationConsumer, RaftStatus, _SeedSyncObj
from cluster.raft_front_server import FrontStatistics
from migratory.model.message import Message
from migratory.server import gc_pauses


@pytest.fixture
def no_automatic_collections() -> Iterator[None]:
    gc.disable()
    try:
        yield
    finally:
        gc.enable()


@pytest.mark.usefixtures("no_automatic_collections")
def test_a_seed_taking_forwarded_publishes_whose_commits_are_late_is_not_idle(
    tmp_path: Path,
) -> None:
    """A seed whose publishes come from non-seeds (forwarded) holds them in its Raft
    commands until they commit; an overloaded cluster commits late, the hub applies
    nothing for seconds, and an "idle" full collection would walk them all. Taking them
    is activity. (On the code before: 1 idle collection here.)"""
    gc.collect(1)  # a full collection is pending
    node = node_at(tmp_path)
    seed = node.seed
    assert seed is not None
    raft = FakeRaft()
    seed._build_raft = lambda: raft  # type: ignore[assignment,return-value]
    hub_activity = node.server.ctx.hub.activity
    stats = gc_pauses.GcPauseStatistics()

    async def main() -> None:
        async with trio.open_nursery() as nursery:
            await nursery.start(seed.run)
            await raft_built(seed)
            nursery.start_soon(functools.partial(
                gc_pauses.collect_when_idle, node.server.activity, stats
            ))
            for n in range(35):  # 3.5 s, a forward every 0.1 s, none committed
                request = PublishRequest("127.0.0.1:9#n", n + 1, Message("/a/b", b"x"))
                seed.take_forward("127.0.0.1:9", [request])
                await trio.sleep(0.1)
            nursery.cancel_scope.cancel()

    trio.run(main, clock=trio.testing.MockClock(autojump_threshold=0))
    assert len(raft.commands) == 35  # each submitted, none committed
    assert node.server.ctx.hub.activity == hub_activity
    assert node.server.ctx.stats.publishes_received == 0  # no client of its own
    assert stats.idle_collections == 0


class NoLinks(Unconnected):
    """No sockets, and the Raft port's front as a seed's transport reports it."""

    def front_statistics(self) -> FrontStatistics:
        return FrontStatistics()

    def listen_error(self) -> str | None:
        return None

    def refused_by(self) -> tuple[str, ...]:
        return ()


def seed_syncobj(others: list[str]) -> _SeedSyncObj:
    """A seed's real Raft node: no tick thread, no network (the test hands it messages)."""
    conf = SyncObjConf(autoTick=False, password="seed-activity")
    node = _SeedSyncObj(
        "127.0.0.1:47901", others, conf=conf, transportClass=NoLinks,
        consumer=CoordinationConsumer(lambda batch: None),
    )
    node._term_quorum.waiting = False  # it knows the current term (no seed to ask)
    return node


class FollowerRaft(FakeRaft):
    """The seed's Raft as the seed reads it: the status a real follower published."""

    def __init__(self, syncobj: _SeedSyncObj) -> None:
        super().__init__()
        self.syncobj = syncobj

    @property  # type: ignore[override]
    def snapshot(self) -> RaftStatus:
        return self.syncobj.status_snapshot

    @snapshot.setter
    def snapshot(self, value: RaftStatus) -> None:
        pass


@pytest.mark.usefixtures("no_automatic_collections")
def test_a_follower_seed_taking_raft_entries_whose_commits_are_late_is_not_idle(
    tmp_path: Path,
) -> None:
    """A follower seed whose clients publish nothing still takes every entry the leader
    sends; when the leader commits late (overloaded), the follower applies nothing for
    seconds while its Raft log fills, and an "idle" full collection stopped its loop and
    its Raft thread (<= 163 ms each, docs/benchmarks.md). Taking entries is activity.
    (On the code before: 1 idle collection here.)"""
    gc.collect(1)  # a full collection is pending
    node = node_at(tmp_path)
    seed = node.seed
    assert seed is not None
    follower = seed_syncobj(["127.0.0.1:47902", "127.0.0.1:47903"])
    raft = FollowerRaft(follower)
    seed._build_raft = lambda: raft  # type: ignore[assignment,return-value]
    hub_activity = node.server.ctx.hub.activity
    stats = gc_pauses.GcPauseStatistics()

    async def main() -> None:
        async with trio.open_nursery() as nursery:
            await nursery.start(seed.run)
            await raft_built(seed)
            nursery.start_soon(functools.partial(
                gc_pauses.collect_when_idle, node.server.activity, stats
            ))
            for n in range(35):  # 3.5 s, an entry every 0.1 s, the commit index stays 1
                append(follower, n + 1, [(n + 2, 1, b"command %d" % n)], commit=1)
                follower.publish_status(time.monotonic())  # (the Raft thread's, each tick)
                await trio.sleep(0.1)
            nursery.cancel_scope.cancel()

    try:
        trio.run(main, clock=trio.testing.MockClock(autojump_threshold=0))
    finally:
        follower.destroy()
    assert follower._SyncObj__raftLog[-1][1] == 36  # each entry held, none committed
    assert follower.status_snapshot.commit_index == 1
    assert node.server.ctx.hub.activity == hub_activity
    assert stats.idle_collections == 0


def test_a_leader_seed_counts_the_commands_it_appends() -> None:
    """A leader's commands -- its own and those follower seeds forward to it -- are
    entries it takes too; becoming leader (its no-op entry) is not one."""
    leader = seed_syncobj([])  # one seed alone: it elects itself
    try:
        for _ in range(500):  # its election timeout, 0.15-0.3 s of ticks
            leader._onTick(0.01)
            if leader.status_snapshot.state == "leader":
                break
        assert leader.status_snapshot.state == "leader"
        assert leader.status_snapshot.entries_taken == 0
        for n in range(3):
            leader._status_consumer.commit_batch(n, [], callback=None)
        leader._onTick(0.0)
        leader.publish_status(time.monotonic())
        assert leader.status_snapshot.entries_taken == 3
    finally:
        leader.destroy()
