"""A member's replica: committed batches in CLSN order, gap detection, cache sync."""

from __future__ import annotations

from dataclasses import replace

import pytest

from cluster.cache_sync import CacheSync, SubjectSync, export_sync
from cluster.coordination import UNNUMBERED_EPOCH, CommittedBatch, Coordinator, PublishRequest
from cluster.replica import Offer, Replica
from migratory.model.message import Message, MessageType
from migratory.model.position import Position
from migratory.protocol import ops
from migratory.protocol.websocket import BinaryMessage, FrameDecoder
from migratory.server.hub import Hub

IBM = "/Stocks/NYSE/IBM"
LAL = "/Scores/NBA/LAL"


class RecordingSink:
    def __init__(self) -> None:
        self.frames: list[bytes] = []

    def deliver(self, frame: bytes) -> None:
        self.frames.append(frame)


def new_replica(*, max_buffered: int = 1024, skip_to: int = 0) -> Replica:
    replica = Replica(Hub(epoch=UNNUMBERED_EPOCH, max_cached_messages=3), max_buffered=max_buffered)
    replica.skip_to(skip_to)
    return replica


def committed(count: int, subjects: tuple[str, ...] = (IBM,)) -> list[CommittedBatch]:
    """``count`` batches, one message per subject each, numbered by a coordinator."""
    coordinator = Coordinator()
    return [
        coordinator.apply_batch(
            700,
            [
                PublishRequest("a", i * len(subjects) + k,
                               Message(s, f"{s}:{i}".encode(), retained=i % 2 == 0))
                for k, s in enumerate(subjects)
            ],
        )
        for i in range(count)
    ]


def subjects(replica: Replica) -> tuple[SubjectSync, ...]:
    return export_sync(replica.hub, replica.applied_clsn).subjects


def sync_of(replica: Replica) -> CacheSync:
    sync = replica.make_sync()
    assert sync is not None
    return sync


def contents(replica: Replica, subject: str = IBM) -> list[bytes]:
    (record,) = [r for r in subjects(replica) if r.subject == subject]
    return [m.content for m in record.cached]


def test_hub_must_use_the_unnumbered_epoch() -> None:
    with pytest.raises(ValueError, match="UNNUMBERED_EPOCH"):
        Replica(Hub(epoch=12345))


def test_batches_in_order_are_applied_and_fanned_out() -> None:
    replica = new_replica()
    sink = RecordingSink()
    replica.hub.subscribe(sink, ops.SubscriptionRequest(IBM), 0.0)
    batches = committed(2)
    assert [replica.offer(b, 0.0) for b in batches] == [Offer.APPLIED, Offer.APPLIED]
    assert replica.applied_clsn == 2 and not replica.needs_sync
    assert replica.hub.position(IBM) == Position(700, 2)
    assert len(sink.frames) == 2


def test_a_batch_at_or_below_the_applied_clsn_is_a_duplicate() -> None:
    replica = new_replica()
    batches = committed(2)
    for b in batches:
        replica.offer(b, 0.0)
    assert replica.offer(batches[0], 0.0) is Offer.DUPLICATE
    assert replica.offer(batches[1], 0.0) is Offer.DUPLICATE
    assert replica.hub.position(IBM) == Position(700, 2)


def test_a_gap_buffers_and_then_nothing_is_applied_until_a_sync() -> None:
    replica = new_replica()
    b1, b2, b3 = committed(3)
    assert replica.offer(b1, 0.0) is Offer.APPLIED
    assert replica.offer(b3, 0.0) is Offer.GAP
    assert replica.needs_sync and replica.buffered == 1
    assert replica.offer(b2, 0.0) is Offer.GAP  # the next one, but a sync is pending
    assert replica.applied_clsn == 1 and replica.hub.position(IBM) == Position(700, 1)


def test_the_buffer_is_bounded_and_keeps_the_newest() -> None:
    replica = new_replica(max_buffered=2)
    batches = committed(5)
    for b in batches[1:]:
        replica.offer(b, 0.0)
    assert replica.buffered == 2
    replica.install_sync(CacheSync(clsn=0, subjects=()), 0.0)
    assert replica.needs_sync and replica.applied_clsn == 0  # 4 and 5 do not follow 0


def test_a_batch_the_hub_cannot_apply_means_a_sync() -> None:
    replica = new_replica()
    b1, b2 = committed(2)
    replica.offer(b1, 0.0)
    bad = CommittedBatch(2, (b2.messages[0].with_position(700, 5),), b2.origins)
    assert replica.offer(bad, 0.0) is Offer.GAP
    assert replica.needs_sync and replica.applied_clsn == 1


def test_make_sync_has_positions_snapshots_and_cached_messages() -> None:
    replica = new_replica()
    for b in committed(5, (IBM, LAL)):
        replica.offer(b, 0.0)
    sync = sync_of(replica)
    assert sync.clsn == 5
    by_subject = {s.subject: s for s in sync.subjects}
    assert set(by_subject) == {IBM, LAL}
    ibm = by_subject[IBM]
    assert (ibm.epoch, ibm.seq) == (700, 5)
    assert [m.seq for m in ibm.cached] == [3, 4, 5]  # max_cached_messages=3
    assert ibm.snapshot is not None and ibm.snapshot.content == f"{IBM}:4".encode()


def test_a_replica_needing_a_sync_cannot_give_one() -> None:
    replica = new_replica(skip_to=4)
    assert replica.make_sync() is None


def test_install_sync_replaces_subjects_then_applies_buffered_batches() -> None:
    peer, late = new_replica(), new_replica(skip_to=2)  # started from a Raft dump at 2
    batches = committed(6, (IBM, LAL))
    for b in batches[:4]:
        peer.offer(b, 0.0)
    for b in batches[2:]:
        assert late.offer(b, 0.0) is Offer.GAP
    late.install_sync(sync_of(peer), 1.0)
    assert not late.needs_sync and late.applied_clsn == 6 and late.buffered == 0
    for b in batches[4:]:
        peer.offer(b, 0.0)
    assert subjects(late) == subjects(peer)


def test_install_sync_stays_in_need_when_the_buffer_does_not_follow() -> None:
    peer, late = new_replica(), new_replica()
    batches = committed(6)
    peer.offer(batches[0], 0.0)
    late.offer(batches[4], 0.0)
    late.install_sync(sync_of(peer), 0.0)
    assert late.needs_sync and late.applied_clsn == 1
    assert late.hub.position(IBM) == Position(700, 1)


def test_install_sync_forgets_subjects_the_peer_does_not_have() -> None:
    replica = new_replica()
    for b in committed(2, (IBM, LAL)):
        replica.offer(b, 0.0)
    sync = sync_of(replica)
    only_ibm = replace(sync, subjects=tuple(s for s in sync.subjects if s.subject == IBM))
    replica.install_sync(only_ibm, 0.0)
    assert replica.hub.position(LAL) is None
    assert [s.subject for s in sync_of(replica).subjects] == [IBM]


def test_skip_to_needs_a_sync_that_reaches_the_skipped_batches() -> None:
    peer, late = new_replica(), new_replica()
    batches = committed(4)
    for b in batches[:2]:
        peer.offer(b, 0.0)
    assert late.skip_to(3) and late.needs_sync  # batches 1..3 will not be offered
    late.install_sync(sync_of(peer), 0.0)  # a peer at 2 is not enough
    assert late.needs_sync and late.applied_clsn == 2
    for b in batches[2:]:
        peer.offer(b, 0.0)
    late.install_sync(sync_of(peer), 0.0)
    assert not late.needs_sync and late.applied_clsn == 4


def test_skip_to_at_or_below_the_applied_clsn_changes_nothing() -> None:
    replica = new_replica()
    for b in committed(2):
        replica.offer(b, 0.0)
    assert not replica.skip_to(2) and not replica.skip_to(0)


def test_batches_offered_again_while_waiting_are_kept_once_in_clsn_order() -> None:
    peer, late = new_replica(), new_replica()
    batches = committed(5)
    peer.offer(batches[0], 0.0)
    late.offer(batches[0], 0.0)
    for b in (batches[3], batches[4], batches[1], batches[2], batches[3]):
        assert late.offer(b, 0.0) is Offer.GAP  # 4 first: the rest waits for a sync
    assert late.buffered == 4
    late.install_sync(sync_of(peer), 0.0)
    assert not late.needs_sync and late.applied_clsn == 5
    assert [m.seq for m in sync_of(late).subjects[0].cached] == [3, 4, 5]


def test_an_older_sync_is_refused_and_changes_nothing() -> None:
    """A peer behind this member (the lagging seed a non-seed failed over to) must never
    move it back: the sync is refused, not installed, and nothing is raised."""
    replica, behind = new_replica(), new_replica()
    batches = committed(3, (IBM, LAL))
    for b in batches:
        replica.offer(b, 0.0)
    behind.offer(batches[0], 0.0)
    before = subjects(replica)
    assert replica.install_sync(sync_of(behind), 0.0) is False
    assert replica.applied_clsn == 3 and subjects(replica) == before
    assert not replica.needs_sync


def test_a_replica_held_back_needs_a_sync_from_its_first_held_batch() -> None:
    replica = new_replica()
    batches = committed(6)
    replica.offer(batches[0], 0.0)
    replica.offer(batches[4], 0.0)
    assert replica.sync_floor == 4  # a sync at 4 lets batch 5 follow
    assert new_replica(skip_to=3).sync_floor == 3


def test_a_malformed_sync_changes_nothing() -> None:
    replica = new_replica()
    for b in committed(3):
        replica.offer(b, 0.0)
    good = sync_of(replica)
    (ibm,) = good.subjects
    holes = SubjectSync(IBM, 700, 3, None, (ibm.cached[0], ibm.cached[2]))
    before = subjects(replica)
    for bad in (holes, replace(ibm, seq=0), replace(ibm, epoch=701)):
        with pytest.raises(ValueError):
            replica.install_sync(CacheSync(clsn=9, subjects=(bad,)), 0.0)
    assert subjects(replica) == before and replica.applied_clsn == 3


# --- a sync installed a slice at a time --------------------------------------------

MANY = tuple(f"/s/{i}" for i in range(6))


def test_batches_offered_while_a_sync_is_installed_in_slices_wait_for_its_end() -> None:
    peer, late = new_replica(), new_replica()
    batches = committed(5, MANY)
    for b in batches[:4]:
        peer.offer(b, 0.0)
    install = late.begin_install(sync_of(peer))
    assert install is not None
    turns = 0
    while not late.install_slice(install, 0.0, budget=4):  # a subject and its 3 messages
        turns += 1
        assert late.needs_sync and late.capture_sync() is None  # nothing half given
        if turns == 8:  # halfway through the installing (after 6 slices of checking)
            assert late.offer(batches[4], 0.0) is Offer.GAP
            assert late.sync_floor == 4  # only a sync as recent makes it whole again
    assert install.done and turns == 12
    assert not late.needs_sync and late.applied_clsn == 5  # the batch held back, applied
    peer.offer(batches[4], 0.0)
    assert subjects(late) == subjects(peer)


def test_a_sync_older_than_one_half_installed_is_refused() -> None:
    peer, older, late = new_replica(), new_replica(), new_replica()
    batches = committed(4, MANY)
    for b in batches:
        peer.offer(b, 0.0)
    older.offer(batches[0], 0.0)
    install = late.begin_install(sync_of(peer))
    assert install is not None
    while not install.changed:
        late.install_slice(install, 0.0, budget=4)
    assert late.begin_install(sync_of(older)) is None  # would move subjects back
    assert late.install_sync(sync_of(older), 0.0) is False
    assert late.installing is install


def test_a_sync_installed_at_once_takes_the_place_of_one_in_slices() -> None:
    """A Raft dump loaded while a peer's sync is half installed (a seed)."""
    peer, late = new_replica(), new_replica()
    batches = committed(4, MANY)
    for b in batches[:2]:
        peer.offer(b, 0.0)
    first = sync_of(peer)
    for b in batches[2:]:
        peer.offer(b, 0.0)
    install = late.begin_install(first)
    assert install is not None
    while not install.changed:
        late.install_slice(install, 0.0, budget=4)
    assert late.install_sync(sync_of(peer), 0.0)
    assert late.install_slice(install, 0.0, budget=4) and not install.done  # given up
    assert late.applied_clsn == 4 and not late.needs_sync
    assert subjects(late) == subjects(peer)


def test_a_malformed_record_found_in_a_later_slice_changes_nothing() -> None:
    peer, late = new_replica(), new_replica()
    batches = committed(3, MANY)
    for b in batches:
        peer.offer(b, 0.0)
    late.offer(batches[0], 0.0)
    good = sync_of(peer)
    bad = CacheSync(3, (*good.subjects, replace(good.subjects[0], subject="/t/x")))
    before = subjects(late)
    install = late.begin_install(bad)
    assert install is not None
    with pytest.raises(ValueError):
        while not late.install_slice(install, 0.0, budget=4):
            pass
    assert install.slices == 7 and not install.changed
    assert subjects(late) == before and late.applied_clsn == 1 and not late.needs_sync
    assert late.installing is None


# --- resuming on another member (the hub's rules for a cluster) ----------------------


def resume(hub: Hub, position: Position) -> list[ops.ServerOp]:
    return hub.subscribe(RecordingSink(), ops.SubscriptionRequest(IBM, position), 0.0)


def test_a_subscriber_that_saw_nothing_recovers_everything_on_a_peer() -> None:
    origin, peer = new_replica(), new_replica()
    allow = origin.hub.subscribe(RecordingSink(), ops.SubscriptionRequest(IBM), 0.0)
    assert allow == [ops.SubjectStatus(ops.Status.SUBSCRIBE_ALLOW, IBM, Position(1, 0))]
    for b in committed(2):
        peer.offer(b, 0.0)  # the origin crashed before applying them
    out = resume(peer.hub, Position(UNNUMBERED_EPOCH, 0))
    assert isinstance(out[1], ops.Deliver)
    assert [(m.seq, m.type) for m in out[1].messages] == [
        (1, MessageType.RECOVERED),
        (2, MessageType.RECOVERED),
    ]
    assert out[2] == ops.SubjectStatus(ops.Status.DATA_SYNC, IBM, Position(700, 2))


def test_saw_nothing_but_the_peer_cache_no_longer_reaches_back_is_a_resync() -> None:
    peer = new_replica()
    for b in committed(5):
        peer.offer(b, 0.0)
    out = resume(peer.hub, Position(UNNUMBERED_EPOCH, 0))
    assert out[-1] == ops.SubjectStatus(ops.Status.DATA_RESYNC, IBM, Position(700, 5))


def test_a_lagging_member_that_has_not_numbered_the_subject_keeps_the_client_position() -> None:
    """It waits for the client's position, then DATA_SYNC: it only lags, nothing was
    missed (was: DATA_RESYNC at once, then DATA_SYNC; test_cluster_lagging_resume.py)."""
    lagging = new_replica()
    sink = RecordingSink()
    out = lagging.hub.subscribe(sink, ops.SubscriptionRequest(IBM, Position(700, 4)), 0.0)
    assert out == [ops.SubjectStatus(ops.Status.SUBSCRIBE_ALLOW, IBM)]
    for b in committed(5):
        lagging.offer(b, 0.0)
    decoder = FrameDecoder(client_frames=False)
    received = [ops.decode_server_op(e.data) for e in decoder.events(b"".join(sink.frames))
                if isinstance(e, BinaryMessage)]
    assert received[0] == ops.SubjectStatus(ops.Status.DATA_SYNC, IBM, Position(700, 4))
    assert [m.seq for op in received[1:] if isinstance(op, ops.Deliver)
            for m in op.messages] == [5]


def test_the_log_after_a_dump_is_held_whole_while_the_dump_installs() -> None:
    """A seed restarted after a compaction installs its Raft dump in slices while Raft
    replays the log after it: every replayed batch must be kept until the install ends,
    however many (the log is bounded by the compaction thresholds). Before, the buffer
    kept the newest ``max_buffered`` only: a tail longer than that left a gap only a
    peer's sync could fill, and with every member restarted no peer had one -- the
    cluster never became ready again (chaos seed 2813: 2,400 batches after the dump)."""
    peer, restarted = new_replica(), new_replica(max_buffered=4)
    batches = committed(30, MANY)
    for b in batches[:10]:
        peer.offer(b, 0.0)
    install = restarted.begin_install(sync_of(peer))  # the dump at clsn 10
    assert install is not None
    for b in batches[10:]:  # the replay, all of it before the install's first slice
        assert restarted.offer(b, 0.0) is Offer.GAP
    while not restarted.install_slice(install, 0.0, budget=4):
        pass
    assert not restarted.needs_sync and restarted.applied_clsn == 30
    for b in batches[10:]:
        peer.offer(b, 0.0)
    assert subjects(restarted) == subjects(peer)
    waiting = new_replica(max_buffered=4)  # no install: a wait for a peer stays bounded
    for b in batches[1:]:
        waiting.offer(b, 0.0)
    assert waiting.buffered == 4
