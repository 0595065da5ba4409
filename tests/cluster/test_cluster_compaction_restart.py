"""Issue 8: every seed restarted after Raft log compaction, with real member processes.

Once pysyncobj has compacted its log into ``raft.dump``, a restarted seed loads the
dump and no longer has the batches it replaced. Before the fix the dump held only the
numbering: the seed needed a peer's caches, a seed asked for them while needing them
itself raised ``RuntimeError: a replica that needs a sync cannot give one`` out of its
link handler and exited, and with all three seeds restarted the cluster never became
ready again. Now the caches are part of the dumped state: every member comes back,
nothing acknowledged is lost, and a resume from a position the dump covers gets its
messages (``DATA_SYNC``), not ``DATA_RESYNC``.
"""

from __future__ import annotations

import time
from pathlib import Path

import pytest
from cluster_fixture import LocalCluster
from cluster_load import LoadPublisher, LoadSubscriber, delivery_problems

from migratory.model.message import MessageType
from migratory.model.position import Position
from migratory.protocol import ops

SEEDS = [0, 1, 2]
NON_SEED = 3
RESUME_BACK = 900
"""How far back (per subject) the resume starts: within the 1,000 cached messages,
and more than a second of publishing (the longest a dump lags behind)."""


def publish_for(cluster: LocalCluster, seconds: float, tag: str) -> LoadPublisher:
    """Publishes (1,500/s at most) until ``1000 * seconds`` are acknowledged: a count of
    messages, however long a busy box takes for them (it asserted that many within
    ``seconds``: a speed claim)."""
    publisher = LoadPublisher([cluster.port(NON_SEED)], rate=1500, duration=120, tag=tag)
    publisher.start()
    try:
        publisher.wait_acked(int(1000 * seconds) + 1, 120)  # the 120 s: a hang guard
    finally:
        publisher.stop()
    return publisher


def restart(cluster: LocalCluster, seeds: list[int]) -> float:
    """SIGKILL ``seeds`` and start them again; seconds until every member is ready."""
    for i in seeds:
        cluster.kill(i)
    started = time.monotonic()
    for i in seeds:
        cluster.start(i)
    cluster.wait_ready(timeout=30)
    return time.monotonic() - started


def merged(publishers: list[LoadPublisher]) -> dict[str, list[tuple[bytes, Position]]]:
    acked: dict[str, list[tuple[bytes, Position]]] = {}
    for publisher in publishers:
        for subject, messages in publisher.acked_messages().items():
            acked.setdefault(subject, []).extend(messages)
    return acked


def contents(acked: dict[str, list[tuple[bytes, Position]]]) -> set[bytes]:
    return {content for messages in acked.values() for content, _ in messages}


@pytest.mark.slow
def test_seeds_restarted_after_log_compaction_come_back_with_their_caches(
    tmp_path: Path,
) -> None:
    cluster = LocalCluster(
        tmp_path, members=4, seeds=3,
        ClusterLogCompactionEntries="100", ClusterLogCompactionTime="1",
    )
    cluster.start_all()
    try:
        cluster.wait_ready(timeout=40)
        subscriber = LoadSubscriber([cluster.port(NON_SEED)], duration=120)
        subscriber.start()
        subscriber.wait_subscribed(10)
        publishers = [publish_for(cluster, 4, "a")]
        time.sleep(1.5)  # the last batches reach a dump too
        dumps = [tmp_path / "data" / f"migratory-{i}" / "raft.dump" for i in SEEDS]
        assert all(dump.exists() for dump in dumps), [d.exists() for d in dumps]

        leader = cluster.leader()
        follower = next(i for i in SEEDS if i != leader)
        two_back = restart(cluster, [leader, follower])
        publishers.append(publish_for(cluster, 3, "b"))
        time.sleep(1.5)
        all_back = restart(cluster, SEEDS)
        assert cluster.exited() == {}, "a member exited on its own"
        restored = sum(cluster.log(i).count("caches restored from the Raft dump") for i in SEEDS)

        # a resume from a position only the dumps hold now, on a restarted seed
        before = merged(publishers)
        positions = {s: messages[-RESUME_BACK][1] for s, messages in before.items()}
        resumer = LoadSubscriber([cluster.port(leader)], positions=positions, duration=30)
        resumer.start()
        resumer.wait_statuses(4, ops.Status.DATA_SYNC, ops.Status.DATA_RESYNC, timeout=15)
        assert {s.status for s in resumer.statuses()} == {
            ops.Status.SUBSCRIBE_ALLOW, ops.Status.DATA_SYNC
        }, resumer.statuses()
        resumer.stop()
        recovered = [m for m in resumer.messages() if m.type is MessageType.RECOVERED]
        assert len(recovered) == 4 * (RESUME_BACK - 1)
        assert delivery_problems(resumer.messages(), before, after=positions) == []

        publishers.append(publish_for(cluster, 2, "c"))
        acked = merged(publishers)
        subscriber.wait_for(contents(acked), 30)
        subscriber.stop()
        assert delivery_problems(subscriber.messages(), acked) == []
        assert subscriber.statuses(ops.Status.DATA_RESYNC) == []
        assert cluster.exited() == {}
        for i in range(4):
            assert "Traceback" not in cluster.log(i), cluster.log(i)[-3000:]
        assert restored >= 3
        print(f"two seeds back in {two_back:.1f} s, all three in {all_back:.1f} s; "
              f"{restored} restores from a dump; " + "; ".join(p.summary() for p in publishers))
    finally:
        cluster.stop()
