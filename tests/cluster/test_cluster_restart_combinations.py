"""Restarts combined with another fault, with real member processes (3 seeds, a non-seed).

- **Every seed SIGKILLed twice within one election timeout** of its first restart
  (the non-seed, its publisher and its subscribers live on), then a subscriber resumes
  on a seed from a position taken before the first kill: ``DATA_SYNC``, every
  acknowledged message once, in order.
- **A non-seed SIGKILLed and restarted while its upstream seed is SIGSTOPped** (a
  frozen VM: its ports still accept), its subscriber resuming on it alone: it must find
  another seed, sync, and resume the subscriber with ``DATA_SYNC``.

- **Every seed's ``ClusterDataDir`` lost at once** (a new cluster, docs/cluster.md)
  while the non-seed lives on, a subscriber on it. The new seeds stood at a lower clsn
  than the non-seed and took it for a member ahead of them: it said it was ready and its
  subscriber received nothing of the new cluster, no ``DATA_RESYNC`` either (0 of 300
  acknowledged, 2026-11-29). Now it is told ``DATA_RESYNC`` on every subject and then
  receives every later acknowledged message (:mod:`cluster.sync_history`).

Checked as the other combinations are (:func:`check_everything`: the chaos tests'
exactly-once, in order, every ``PUBLISH_OK`` delivered, no ``DATA_RESYNC``, failures
truthful).
"""

from __future__ import annotations

import shutil
import signal
import time
from collections.abc import Sequence
from pathlib import Path

import pytest
from cluster_fixture import LocalCluster
from cluster_load import LoadPublisher, LoadSubscriber, delivery_problems
from test_cluster_fault_combinations import CACHE, check_everything, merged_acks, upstream_of
from whole_outage import HANG_GUARD, data_dir, power_cut, publish_until, raft_state

from migratory.model.message import MessageType
from migratory.model.position import Position
from migratory.protocol import ops

SEEDS = [0, 1, 2]
NON_SEED = 3
ELECTION_TIMEOUT = 0.15  # s: ClusterElectionTimeout's default


def acked_positions(publisher: LoadPublisher) -> dict[str, Position]:
    return {s: m[-1][1] for s, m in publisher.acked_messages().items()}


def loaded(
    cluster: LocalCluster, subscribed: Sequence[int], publishing: Sequence[int]
) -> tuple[LoadSubscriber, LoadPublisher, dict[str, Position]]:
    """A live subscriber on the members ``subscribed`` (in turn), a publisher through
    ``publishing`` (300/s) with 300 acknowledged, and where each subject stood then."""
    live = LoadSubscriber([cluster.port(i) for i in subscribed], tag="live",
                          duration=HANG_GUARD * 2)
    live.start()
    live.wait_subscribed(15)
    publisher = LoadPublisher([cluster.port(i) for i in publishing], rate=300,
                              duration=HANG_GUARD * 2)
    publisher.start()
    publish_until(publisher, 300)
    return live, publisher, acked_positions(publisher)


def resumed_and_checked(
    cluster: LocalCluster, members: Sequence[int], before: dict[str, Position],
    live: LoadSubscriber, publisher: LoadPublisher,
) -> None:
    """A subscriber resumes on ``members`` from ``before`` (DATA_SYNC, not checked until
    the end); 100 more acknowledged; then :func:`check_everything`."""
    resumer = LoadSubscriber([cluster.port(i) for i in members], positions=before,
                             tag="resumer", duration=HANG_GUARD)
    resumer.start()
    resumer.wait_statuses(4, ops.Status.DATA_SYNC, ops.Status.DATA_RESYNC, timeout=15)
    publish_until(publisher, 100)
    publisher.stop()
    check_everything(cluster, [publisher], [live, resumer], killed=set(),
                     starts={"resumer": before})


@pytest.mark.slow
def test_every_seed_killed_twice_within_an_election_timeout_then_an_old_position_resumes(
    tmp_path: Path,
) -> None:
    cluster = LocalCluster(tmp_path, members=4, seeds=3, MaxCachedMessagesPerSubject=CACHE)
    try:
        cluster.start_all()
        cluster.wait_ready(timeout=HANG_GUARD)
        live, publisher, before = loaded(cluster, (NON_SEED, *SEEDS), (NON_SEED, *SEEDS))
        power_cut(cluster, SEEDS)
        cluster.start_all(SEEDS)
        deadline = time.monotonic() + HANG_GUARD
        while not any(raft_state(cluster, i) for i in SEEDS):  # a seed answers: loading
            assert time.monotonic() < deadline, "no seed came back"
            time.sleep(0.005)
        time.sleep(ELECTION_TIMEOUT / 2)
        power_cut(cluster, SEEDS)
        cluster.start_all(SEEDS)
        cluster.wait_ready(timeout=HANG_GUARD)
        publish_until(publisher, 300)
        resumed_and_checked(cluster, SEEDS, before, live, publisher)
        print(publisher.summary())
    finally:
        cluster.stop()


@pytest.mark.slow
def test_a_non_seed_restarted_while_its_upstream_seed_is_frozen(tmp_path: Path) -> None:
    cluster = LocalCluster(tmp_path, members=4, seeds=3, MaxCachedMessagesPerSubject=CACHE)
    frozen = None
    try:
        cluster.start_all()
        cluster.wait_ready(timeout=HANG_GUARD)
        upstream = upstream_of(cluster, NON_SEED)
        leader = cluster.leader()
        via = next(i for i in SEEDS if i != upstream)
        subscriber = LoadSubscriber([cluster.port(NON_SEED)], tag="there",
                                    duration=HANG_GUARD * 2)
        subscriber.start()
        subscriber.wait_subscribed(15)
        publisher = LoadPublisher([cluster.port(via)], rate=300, duration=HANG_GUARD * 2)
        publisher.start()
        publish_until(publisher, 300)
        frozen = cluster.processes[upstream]
        assert frozen is not None
        frozen.send_signal(signal.SIGSTOP)
        cluster.kill(NON_SEED)
        restarted_at = time.monotonic()
        cluster.start(NON_SEED)
        cluster.wait_ready([NON_SEED], timeout=HANG_GUARD)
        ready_after = time.monotonic() - restarted_at
        subscriber.wait_statuses(4, ops.Status.DATA_SYNC, ops.Status.DATA_RESYNC, timeout=15)
        publish_until(publisher, 300)
        frozen.send_signal(signal.SIGCONT)
        frozen = None
        cluster.wait_ready(timeout=HANG_GUARD)
        publish_until(publisher, 100)
        publisher.stop()
        check_everything(cluster, [publisher], [subscriber], killed=set())
        dialled = [line.split("migratory.cluster: ")[-1] for line in
                   cluster.log(NON_SEED).splitlines() if "seed" in line and "WARNING" in line]
        print(f"upstream {upstream} (leader {leader}) frozen; non-seed ready after "
              f"{ready_after:.1f} s; {publisher.summary()}; its links: {dialled}")
    finally:
        if frozen is not None:
            frozen.send_signal(signal.SIGCONT)
        cluster.stop()


@pytest.mark.slow
def test_every_seed_started_anew_while_a_non_seed_lives_on(tmp_path: Path) -> None:
    cluster = LocalCluster(tmp_path, members=4, seeds=3, MaxCachedMessagesPerSubject=CACHE)
    try:
        cluster.start_all()
        cluster.wait_ready(timeout=HANG_GUARD)
        subscriber = LoadSubscriber([cluster.port(NON_SEED)], tag="there",
                                    duration=HANG_GUARD * 2)
        subscriber.start()
        subscriber.wait_subscribed(15)
        old = LoadPublisher([cluster.port(i) for i in SEEDS], rate=300, tag="old",
                            duration=HANG_GUARD)
        old.start()
        publish_until(old, 300)
        old.stop()
        subscriber.wait_for({c for m in old.acked_messages().values() for c, _ in m}, 15)
        power_cut(cluster, SEEDS)
        for i in SEEDS:
            shutil.rmtree(data_dir(cluster, i))
        anew_at = time.monotonic()
        cluster.start_all(SEEDS)
        cluster.wait_ready(SEEDS, timeout=HANG_GUARD)
        first = LoadPublisher([cluster.port(i) for i in SEEDS], rate=300, tag="first",
                              duration=HANG_GUARD)
        first.start()
        publish_until(first, 10)  # the new cluster still behind the non-seed's clsn
        first.stop()
        subscriber.wait_statuses(4, ops.Status.DATA_RESYNC, timeout=15)
        new = LoadPublisher([cluster.port(i) for i in SEEDS], rate=300, tag="new",
                            duration=HANG_GUARD)
        new.start()
        publish_until(new, 600)  # past it
        new.stop()
        resynced = {s.subject: s.position for s in subscriber.statuses(ops.Status.DATA_RESYNC)
                    if s.position is not None}
        acked = merged_acks([first, new])
        subscriber.wait_for({c for s, m in acked.items() for c, p in m if p > resynced[s]}, 20)
        subscriber.stop()
        since = subscriber.messages(since=anew_at)
        assert delivery_problems(since, acked, after=resynced) == []
        assert {m.position.epoch for m in since} & {p.epoch for p in old.acked.values()} == set()
        assert "is of another Raft history" in cluster.log(NON_SEED)
        cluster.wait_ready(timeout=HANG_GUARD)
        old_positions = acked_positions(old)
        for member in (NON_SEED, 0):  # a client back with a position of the old cluster
            stale = LoadSubscriber([cluster.port(member)], positions=old_positions,
                                   tag=f"stale-{member}", duration=HANG_GUARD)
            stale.start()
            stale.wait_statuses(4, ops.Status.DATA_SYNC, ops.Status.DATA_RESYNC, timeout=15)
            stale.stop()
            assert [s.status for s in stale.statuses(ops.Status.DATA_SYNC, ops.Status.DATA_RESYNC)
                    ] == [ops.Status.DATA_RESYNC] * 4, member
            assert [m for m in stale.messages() if m.type is not MessageType.SNAPSHOT] == []
        assert cluster.exited() == {}
        print(f"resynced at {resynced}; {first.summary()}; {new.summary()}")
    finally:
        cluster.stop()


@pytest.mark.slow
def test_a_seed_restarted_with_another_password_then_the_others_restarted(
    tmp_path: Path,
) -> None:
    """A ``ClusterPassword`` change that reached one seed (restarted with it), the two
    others restarted in turn with the old one: while one of them is away no majority
    shares a password (publishes fail, none is acknowledged and lost); the changed seed
    is not ready, its subscriber resumes elsewhere; back with the old password it catches
    up, and a resume there from before its change gets ``DATA_SYNC``."""
    cluster = LocalCluster(tmp_path, members=4, seeds=3, MaxCachedMessagesPerSubject=CACHE)
    try:
        cluster.start_all()
        cluster.wait_ready(timeout=HANG_GUARD)
        changed = cluster.leader()
        others = [i for i in SEEDS if i != changed]
        live, publisher, before = loaded(cluster, (changed, NON_SEED, *others),
                                         (NON_SEED, *others))
        password = cluster.settings[changed]["ClusterPassword"]
        cluster.settings[changed]["ClusterPassword"] = "a-new-cluster-password"
        cluster.kill(changed, signal.SIGTERM)
        cluster.start(changed)
        cluster.wait_refused(changed, "", "wrong ClusterPassword or replay")
        publish_until(publisher, 100)
        for i in others:
            cluster.kill(i, signal.SIGKILL)
            time.sleep(0.5)  # no majority: what is published now fails or waits
            cluster.start(i)
            cluster.wait_ready([i, NON_SEED], timeout=HANG_GUARD)
            publish_until(publisher, 100)
        assert not cluster.ready(changed)
        cluster.settings[changed]["ClusterPassword"] = password
        cluster.kill(changed, signal.SIGTERM)
        cluster.start(changed)
        cluster.wait_ready(timeout=HANG_GUARD)
        resumed_and_checked(cluster, [changed], before, live, publisher)
        print(f"changed seed {changed} (the leader); {publisher.summary()}")
    finally:
        cluster.stop()

