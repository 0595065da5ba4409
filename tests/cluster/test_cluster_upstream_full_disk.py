"""A non-seed's upstream seed stopped by its full disk, with real member processes.

A seed that cannot write its Raft files stops taking part in Raft and exits
(cluster/raft_disk.py); here its compaction's dump cannot be written (a directory where
``raft.dump.tmp`` goes, as in test_cluster_seed_fault_combinations.py). A non-seed
forwarding its publishers' publishes through that seed keeps going through another
while a majority of the seeds is up: what the stopped seed's Raft node refused was
never submitted, so the seed ends the link without an answer and the non-seed forwards
it again through the next seed, ahead of its newer publishes (cluster/raft_outcomes.py).
Before, each such publish was answered ``PUBLISH_FAILED`` ("RAFT_STOPPED": 21 of ~4,000
in the first run).

No Raft leader changes here: the seeds' election timeout is 1 s (``ClusterElectionTimeout``),
not 150 ms. At 150 ms a loaded box (load average 13-22 on 2 cores) had the seeds elect
again and again (terms 3 to 7 in the 20 s of a run): 4 runs of 10 failed, one with "no Raft
leader" at the moment the test looked for it, three with the publishes in flight at an
election answered ``PUBLISH_FAILED`` "the Raft leader changed" (640-1,280; 1,125 more
timed out) -- an election's cost, not this test's subject
(test_cluster_fault_combinations.py stops a leader).
"""

from __future__ import annotations

import signal
import time
from pathlib import Path

import pytest
from cluster_fixture import LocalCluster
from cluster_load import LoadPublisher, LoadSubscriber
from test_cluster_fault_combinations import (
    CACHE,
    check_everything,
    failure_reasons,
    upstream_of,
)

from migratory.server.drain import DRAINING, REFUSED

SEEDS = [0, 1, 2]
NON_SEED = 3
COMPACTING = {"ClusterLogCompactionEntries": "100", "ClusterLogCompactionTime": "1"}
"""A dump every second or so: the seed whose dumps cannot be written stops soon."""
STEADY_LEADER = {"ClusterElectionTimeout": "1000"}
"""No election on a loaded box while the test runs (module docstring)."""


def block_dumps(cluster: LocalCluster, seed: int, timeout: float = 10) -> Path:
    """The seed's next dump cannot be written (once the one being written is): the stop
    a full disk makes. Returns the directory that blocks it (``rmdir`` to mend)."""
    full = cluster.tmp_path / "data" / f"migratory-{seed}" / "raft.dump.tmp"
    deadline = time.monotonic() + timeout
    while True:
        try:
            full.mkdir()
            return full
        except FileExistsError:
            assert time.monotonic() < deadline, f"seed {seed}'s dump stays half-written"
            time.sleep(0.01)


def stopped_by_its_disk(cluster: LocalCluster, seed: int) -> None:
    process = cluster.processes[seed]
    assert process is not None
    process.wait(20)
    assert process.returncode == 1, process.returncode
    assert "cannot write" in cluster.log(seed)


def current_leader(cluster: LocalCluster, timeout: float = 15) -> int:
    """The Raft leader, once there is one (none for a moment during an election)."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            return cluster.leader()
        except RuntimeError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.05)


def terms(cluster: LocalCluster, seeds: list[int]) -> dict[int, int]:
    """Each seed's Raft term: one that moved means an election happened."""
    return {i: int(cluster.status(i).get("raft_term") or 0) for i in seeds}


def following_a_follower(cluster: LocalCluster, non_seed: int) -> int:
    """The non-seed's upstream seed, once it is not the Raft leader (the non-seed
    restarted until it picks another: it picks at random)."""
    for _ in range(8):
        upstream = upstream_of(cluster, non_seed)
        if upstream != current_leader(cluster):
            return upstream
        cluster.kill(non_seed, signal.SIGTERM)
        cluster.start(non_seed)
        cluster.wait_ready([non_seed], timeout=20)
    raise AssertionError("the non-seed kept following the Raft leader")


@pytest.mark.slow
def test_a_non_seeds_upstream_stopped_by_its_full_disk_costs_its_publishers_nothing(
    tmp_path: Path,
) -> None:
    cluster = LocalCluster(tmp_path, members=4, seeds=3, MaxCachedMessagesPerSubject=CACHE,
                           **COMPACTING, **STEADY_LEADER)
    try:
        cluster.start_all()
        cluster.wait_ready(timeout=40)
        upstream = following_a_follower(cluster, NON_SEED)
        watcher = LoadSubscriber([cluster.port(i) for i in SEEDS if i != upstream],
                                 tag="watcher", duration=60)
        local = LoadSubscriber([cluster.port(NON_SEED)], tag="local", duration=60)
        for subscriber in (watcher, local):
            subscriber.start()
            subscriber.wait_subscribed(10)
        others = [i for i in SEEDS if i != upstream]
        publisher = LoadPublisher([cluster.port(NON_SEED)], rate=2000, duration=40)
        own = LoadPublisher([cluster.port(i) for i in (upstream, *others)], rate=1000,
                            duration=40, tag="own")  # the stopped seed's own client
        for p in (publisher, own):
            p.start()
            p.wait_acked(1000, timeout=15)
        before = terms(cluster, others)
        block_dumps(cluster, upstream)
        stopped_by_its_disk(cluster, upstream)
        for p in (publisher, own):
            p.wait_acked(len(p.acked) + 1000, timeout=15)
            p.stop()
        summary = (f"{publisher.summary()}; failures {failure_reasons(publisher)}; own "
                   f"{own.summary()}; failures {failure_reasons(own)}; terms of the other "
                   f"seeds {before} -> {terms(cluster, others)}")
        assert publisher.failed == {}, summary
        assert publisher.unanswered == set(), summary
        assert upstream_of(cluster, NON_SEED) != upstream
        # its own client: each publish its outcome (the drain's close says what it took),
        # refused only by the drain (until it is told to go), never RAFT_STOPPED
        assert own.unanswered == set(), summary
        assert all(reason.split(": ", 1)[1] in (REFUSED, DRAINING)
                   for reason in own.failed.values()), summary
        assert own.links[0] == cluster.port(upstream) and len(own.links) > 1, summary  # moved
        check_everything(cluster, [publisher, own], [watcher, local], {upstream})
        print(f"upstream {upstream} stopped by its disk; {summary}")
    finally:
        cluster.stop()
