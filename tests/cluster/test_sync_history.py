"""A non-seed ahead of seeds that started a new cluster (cluster/sync_history.py, the
upstream's side of it in cluster/upstream.py), in process: the rule on syncs, the
upstream leaving a seed that stays ready and behind it, and the sync of the new history
installed over the old one, its live subscribers told ``DATA_RESYNC``.

With real processes: ``test_cluster_restart_combinations.py``
(``test_every_seed_started_anew_while_a_non_seed_lives_on``)."""

from __future__ import annotations

import pytest

from cluster import link
from cluster.cache_sync import CacheSync, SubjectSync
from cluster.coordination import UNNUMBERED_EPOCH, CommittedBatch, Coordinator, PublishRequest
from cluster.forwarding import Outgoing
from cluster.numbering_state import subject_group
from cluster.publishing import ClusterPublishing
from cluster.replica import Offer, Replica
from cluster.stream import CommittedStream
from cluster.sync_history import another_history
from cluster.upstream import UPSTREAM_BEHIND, LeaveUpstream, UpstreamReplication
from migratory.model.message import Message
from migratory.model.position import Position
from migratory.server.hub import Hub

SUBJECTS = ("/s/a", "/s/b", "/s/c")
OLD, NEW = 700, 900  # the epoch each history's first batch drew
SEED = "10.0.0.1:1"


def history(epoch: int, count: int) -> list[CommittedBatch]:
    """``count`` committed batches of one Raft history, one message of each subject."""
    coordinator = Coordinator()
    return [coordinator.apply_batch(epoch, [
        PublishRequest("a", i * len(SUBJECTS) + k, Message(s, b"%d" % i, retained=True))
        for k, s in enumerate(SUBJECTS)]) for i in range(count)]


def stream_of(committed: list[CommittedBatch]) -> CommittedStream:
    stream = CommittedStream(ClusterPublishing(
        origin="me#1", replica=Replica(Hub(epoch=UNNUMBERED_EPOCH))))
    for batch in committed:
        assert stream.on_committed(batch, 0.0) is Offer.APPLIED
    return stream


def sync_of(committed: list[CommittedBatch]) -> CacheSync:
    sync = stream_of(committed).replica.make_sync()
    assert sync is not None
    return sync


def held(stream: CommittedStream) -> list[tuple[str, Position]]:
    return [(s, p) for s, p, _, _ in stream.replica.hub.numbered()]


def test_a_sync_of_this_members_own_history_proves_nothing() -> None:
    old = history(OLD, 60)
    here = held(stream_of(old))
    assert another_history(sync_of(old[:5]), here) is None
    assert another_history(sync_of(old), here) is None
    assert another_history(CacheSync(0, ()), here) is None  # a new cluster, nothing yet


def test_a_sync_of_a_new_cluster_is_another_history() -> None:
    here = held(stream_of(history(OLD, 60)))
    assert another_history(sync_of(history(NEW, 5)), here) == (
        f"{SUBJECTS[0]} at epoch {NEW} there, {OLD} here")
    further = CacheSync(5, tuple(sync_of(history(OLD, 61)).subjects))  # said to be at 5
    assert another_history(further, here) == (
        f"{SUBJECTS[0]} at seq 61 there, 60 here, at the clsn 5 behind this member's")


def test_a_subject_new_here_in_a_group_held_at_another_epoch() -> None:
    here = [("/s/a", Position(OLD, 60))]
    other = next(f"/t/{i}" for i in range(1000)
                 if subject_group(f"/t/{i}") == subject_group("/s/a"))
    assert another_history(CacheSync(3, (SubjectSync(other, NEW, 3, None, ()),)), here) == (
        f"{other} at epoch {NEW} there, its subject group's {OLD} here")
    elsewhere = next(f"/u/{i}" for i in range(1000)
                     if subject_group(f"/u/{i}") != subject_group("/s/a"))
    assert another_history(  # a group unknown here: no proof
        CacheSync(3, (SubjectSync(elsewhere, NEW, 3, None, ()),)), here) is None


class Listener:
    def __init__(self) -> None:
        self.seqs: list[tuple[int, int]] = []
        self.resyncs: list[Position] = []

    def deliver_message(self, message: Message, qos: int) -> None:
        self.seqs.append((message.epoch, message.seq))

    def resync(self, subject: str, position: Position, snapshot: Message | None,
               qos: int) -> None:
        self.resyncs.append(position)


def upstream_at(stream: CommittedStream) -> UpstreamReplication:
    return UpstreamReplication(name="10.0.0.2:1", seeds=[("10.0.0.1", 1)], password="pw",
                               stream=stream, outgoing=Outgoing(stream.publishing),
                               max_frame=link.MAX_FRAME)


def test_a_seed_ready_and_behind_for_long_is_left_and_its_new_history_installed() -> None:
    """The seeds started anew: their heartbeats stay ready at clsn 5, behind the 60
    applied here. Before, the member stayed on, ready, and its subscribers got nothing."""
    stream = stream_of(history(OLD, 60))
    listener = Listener()
    stream.replica.hub.listen(listener, SUBJECTS[0], 1)
    upstream = upstream_at(stream)
    assert upstream.start_link(SEED, 0.0) == link.Replicate(60)
    upstream._on_op(SEED, link.Heartbeat(5, True), 0.0)
    upstream._on_op(SEED, link.Heartbeat(5, True), UPSTREAM_BEHIND / 2)
    assert upstream.not_ready_reason(UPSTREAM_BEHIND / 2) is None  # a seed's lag, maybe
    with pytest.raises(LeaveUpstream, match="ready at clsn 5, behind the 60 applied here"):
        upstream._on_op(SEED, link.Heartbeat(5, True), UPSTREAM_BEHIND)
    upstream.end_link()
    assert upstream.start_link(SEED, 3.0) == link.Replicate(0, full=True)
    new = history(NEW, 5)
    upstream._on_op(SEED, link.Sync(sync_of(new)), 3.0)
    replica = stream.replica
    assert (replica.applied_clsn, replica.needs_sync) == (5, False)
    assert {p for _, p in held(stream)} == {Position(NEW, 5)}
    assert listener.resyncs == [Position(NEW, 5)]
    assert stream.on_committed(history(NEW, 6)[-1], 3.0) is Offer.APPLIED
    assert listener.seqs[-1] == (NEW, 6)
    assert upstream.start_link(SEED, 4.0) == link.Replicate(6)  # asked once, not again


def test_a_lagging_seed_of_the_same_history_is_refused_as_before() -> None:
    old = history(OLD, 60)
    stream = stream_of(old)
    upstream = upstream_at(stream)
    upstream.start_link(SEED, 0.0)
    for t in (0.0, 1.0):  # behind, then caught up: no clock runs
        upstream._on_op(SEED, link.Heartbeat(5, True), t)
    upstream._on_op(SEED, link.Heartbeat(60, True), 1.5)
    upstream._on_op(SEED, link.Heartbeat(5, True), 2.5)
    upstream._on_op(SEED, link.Heartbeat(5, False), 5.0)  # not ready: that rule's own
    with pytest.raises(LeaveUpstream, match="offered a cache sync at clsn 5, behind"):
        upstream._on_op(SEED, link.Sync(sync_of(old[:5])), 5.0)
    assert stream.replica.applied_clsn == 60


def test_a_subject_moved_to_another_epoch_mid_lineage_is_a_gap() -> None:
    """A new cluster's batch past the old clsn, applied over the old history: the
    subject jumped to the new epoch at seq 7 and its subscribers never got 1..6, untold.
    A new lineage starts at seq 1; a subject with no position yet may start anywhere."""
    hub = Hub(epoch=UNNUMBERED_EPOCH, numbered_elsewhere=True)
    assert hub.apply(Message("/s/a", b"x", epoch=OLD, seq=3), 0.0)  # no position yet
    with pytest.raises(ValueError, match="gap on '/s/a': at 700/3, got seq 7 of another"):
        hub.apply(Message("/s/a", b"y", epoch=NEW, seq=7), 0.0)
    assert hub.position("/s/a") == Position(OLD, 3)
    assert hub.apply(Message("/s/a", b"z", epoch=NEW, seq=1), 0.0)  # a lineage's start
