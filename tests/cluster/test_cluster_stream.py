"""The committed stream and its followers: nobody is ever moved backwards."""

from __future__ import annotations

import pytest
import trio
from publish_answers import Answers

from cluster import link
from cluster.cache_sync import CacheSync
from cluster.coordination import UNNUMBERED_EPOCH, CommittedBatch, Coordinator, PublishRequest
from cluster.link_sync import SyncFrames
from cluster.publishing import ClusterPublishing
from cluster.replica import Offer, Replica
from cluster.stream import FOLLOWER_QUEUE_BYTES, Backlog, CommittedStream, Outbound, wire_bytes
from migratory.model.message import Message
from migratory.protocol import ops
from migratory.server.hub import Hub

IBM = "/Stocks/NYSE/IBM"


def committed(count: int) -> list[CommittedBatch]:
    coordinator = Coordinator()
    return [
        coordinator.apply_batch(700, [PublishRequest("x", i, Message(IBM, f"{i}".encode()))])
        for i in range(count)
    ]


def new_stream(*, ring_size: int = 100, ready: bool = True) -> CommittedStream:
    replica = Replica(Hub(epoch=UNNUMBERED_EPOCH))
    publishing = ClusterPublishing(origin="me#1", replica=replica)
    return CommittedStream(publishing, ring_size=ring_size, is_ready=lambda: ready)


class Follower:
    def __init__(self, stream: CommittedStream, name: str, from_clsn: int, full: bool = False):
        self.send, self.receive = trio.open_memory_channel[Outbound](1000)
        self.backlog = Backlog()
        stream.follow(name, from_clsn, full, self.send, self.backlog)

    def ops(self) -> list[link.LinkOp]:
        """What its link's writer takes (cluster/peers.py), decoded."""
        out = []
        while True:
            try:
                item = self.receive.receive_nowait()
            except trio.WouldBlock:
                return out
            self.backlog.taken(item)
            out.append(link.decode_op(wire_bytes(item)[4:]))

    def batches(self) -> list[int]:
        return [op.batch.clsn for op in self.ops() if isinstance(op, link.Batch)]


def fed(stream: CommittedStream, batches: list[CommittedBatch]) -> CommittedStream:
    for batch in batches:
        assert stream.on_committed(batch, 0.0) is Offer.APPLIED
    return stream


def test_a_follower_behind_within_the_ring_gets_the_missed_batches_then_live() -> None:
    batches = committed(6)
    stream = fed(new_stream(), batches[:4])
    follower = Follower(stream, "n1", from_clsn=1)
    stream.on_committed(batches[4], 0.0)
    ops = follower.ops()
    assert [op.batch.clsn for op in ops if isinstance(op, link.Batch)] == [2, 3, 4, 5]
    assert link.Heartbeat(4, True) in ops  # after the catch-up: ready to compare against


def test_a_follower_ahead_of_this_member_is_never_sent_what_it_has() -> None:
    """The lagging-seed failover: the non-seed applied 5, this seed only 2."""
    batches = committed(7)
    stream = fed(new_stream(), batches[:2])
    follower = Follower(stream, "n1", from_clsn=5)
    assert not any(isinstance(op, link.Sync | link.Batch) for op in follower.ops())
    fed(stream, batches[2:])
    assert follower.batches() == [6, 7]


def test_a_full_sync_waits_until_this_member_reaches_the_follower() -> None:
    batches = committed(6)
    stream = fed(new_stream(), batches[:2])
    follower = Follower(stream, "n1", from_clsn=4, full=True)
    assert not any(isinstance(op, link.Sync) for op in follower.ops())
    fed(stream, batches[2:4])
    syncs = [op for op in follower.ops() if isinstance(op, link.Sync)]
    assert [s.sync.clsn for s in syncs] == [4]
    fed(stream, batches[4:])
    assert follower.batches() == [5, 6]


def test_beyond_the_ring_a_follower_behind_gets_a_sync_not_a_gap() -> None:
    batches = committed(8)
    stream = fed(new_stream(ring_size=2), batches[:6])
    follower = Follower(stream, "n1", from_clsn=1)
    syncs = [op.sync.clsn for op in follower.ops() if isinstance(op, link.Sync)]
    assert syncs == [6]


def test_a_restore_from_a_dump_sends_followers_behind_it_a_sync() -> None:
    batches = committed(5)
    source = fed(new_stream(), batches)
    stream = fed(new_stream(), batches[:1])
    follower = Follower(stream, "n1", from_clsn=1)
    follower.ops()
    sync = source.replica.make_sync()
    assert sync is not None
    assert stream.on_restore(sync, 0.0)
    assert [op.sync.clsn for op in follower.ops() if isinstance(op, link.Sync)] == [5]


def test_an_older_restore_changes_nothing() -> None:
    stream = fed(new_stream(), committed(3))
    assert not stream.on_restore(CacheSync(1, ()), 0.0)
    assert stream.replica.applied_clsn == 3


def test_sync_requests_are_refused_by_a_member_behind_or_not_whole() -> None:
    batches = committed(4)
    stream = fed(new_stream(), batches[:2])
    refused = stream.sync_for(3)
    assert isinstance(refused, link.SyncRefused) and refused.clsn == 2
    assert isinstance(stream.sync_for(2), SyncFrames)
    waiting = new_stream()
    waiting.on_committed(batches[3], 0.0)  # a gap: it needs a sync itself
    assert isinstance(waiting.sync_for(0), link.SyncRefused)
    fresh_but_not_ready = new_stream(ready=False)  # a seed at clsn 0 replaying its log
    assert isinstance(fresh_but_not_ready.sync_for(0), link.SyncRefused)


def test_heartbeats_carry_readiness() -> None:
    assert link.decode_op(new_stream(ready=False).heartbeat()[4:]) == link.Heartbeat(0, False)


def test_a_follower_too_slow_is_dropped_not_blocking() -> None:
    batches = committed(5)
    stream = fed(new_stream(), batches[:1])
    send, _receive = trio.open_memory_channel[Outbound](2)
    stream.follow("slow", 1, False, send)  # heartbeat: 1 of 2
    fed(stream, batches[1:])
    assert "slow" not in stream.followers


def test_a_follower_is_dropped_by_the_bytes_it_has_queued_not_only_by_frames() -> None:
    """A follower that stopped reading (a SIGSTOPped worker, a cut-off non-seed) while
    1 MiB messages flow: dropped once its backlog passes FOLLOWER_QUEUE_BYTES (it will
    resume from the ring or a sync), long before its 1,000 frames are queued; one whose
    writer keeps taking stays."""
    content = bytes(1 << 20)  # one object, shared by every message: cheap
    coordinator = Coordinator()
    stream = new_stream(ring_size=10)
    stuck, reading = Follower(stream, "stuck", 0), Follower(stream, "reading", 0)
    stuck_ops, _ = stuck.ops(), reading.ops()  # their heartbeats; the stuck one reads no more
    published = 0
    while "stuck" in stream.followers and published < 500:
        batch = coordinator.apply_batch(
            700, [PublishRequest("x", published, Message(IBM, content))]
        )
        assert stream.on_committed(batch, 0.0) is Offer.APPLIED
        published += 1
        assert len(reading.ops()) == 1
    assert "stuck" not in stream.followers and stuck_ops
    assert published == FOLLOWER_QUEUE_BYTES // (len(content) + len(IBM)) + 1
    assert "reading" in stream.followers and reading.backlog.bytes == 0


def test_each_batch_is_encoded_once_for_every_follower() -> None:
    batches = committed(3)
    stream = fed(new_stream(), batches[:1])
    a, b = Follower(stream, "a", 1), Follower(stream, "b", 1)
    a.ops(), b.ops()
    stream.on_committed(batches[1], 0.0)
    item_a, item_b = a.receive.receive_nowait(), b.receive.receive_nowait()
    assert item_a is item_b
    assert wire_bytes(item_a) is wire_bytes(item_b)


def test_a_member_nobody_follows_never_encodes_a_batch(monkeypatch: pytest.MonkeyPatch) -> None:
    encoded: list[int] = []
    encode = link.encode_frame

    def counting(op: link.LinkOp) -> bytes:
        if isinstance(op, link.Batch):
            encoded.append(op.batch.clsn)
        return encode(op)

    monkeypatch.setattr(link, "encode_frame", counting)
    stream = fed(new_stream(), committed(5))
    assert len(stream.ring) == 5 and encoded == []
    late = Follower(stream, "late", 2)  # catches up from the ring: 3, 4 and 5
    assert late.batches() == [3, 4, 5]
    assert encoded == [3, 4, 5]


def test_the_ring_gives_back_the_committed_batches_it_kept() -> None:
    batches = committed(6)
    stream = fed(new_stream(), batches)
    assert list(stream.ring.after(3)) == batches[3:]


def test_a_publish_pending_across_a_jump_is_never_failed_as_not_published() -> None:
    """Found by the cluster model: this member's publish was committed in a batch that a
    sync replaced (no acknowledgement from it); a barrier then says "not published"."""
    stream = new_stream()
    answers = Answers()
    stream.publishing.submit(Message(IBM, b"mine"), answers, 0.0)
    (request,) = stream.publishing.take_outgoing()
    coordinator = Coordinator()
    batch = coordinator.apply_batch(700, [request])  # committed, never offered here
    source = fed(new_stream(), [batch])
    sync = source.replica.make_sync()
    assert sync is not None and stream.install_sync(sync, 1.0)
    origin = [(request.origin, request.ref)]
    stream.publishing.on_failed(origin, "the Raft leader changed", unknown=False, now=2.0)
    assert answers.results == []
    stream.publishing.expire(20.0)
    (answer,) = answers.results
    assert answer.status is ops.Status.PUBLISH_FAILED and answer.reason is not None
    assert answer.reason.startswith("outcome unknown")


def test_a_definite_failure_without_a_jump_is_not_published() -> None:
    stream = fed(new_stream(), committed(1))
    answers = Answers()
    stream.publishing.submit(Message(IBM, b"mine"), answers, 0.0)
    (request,) = stream.publishing.take_outgoing()
    stream.publishing.on_failed([(request.origin, request.ref)], "MISSING_LEADER",
                                unknown=False, now=1.0)
    (answer,) = answers.results
    assert answer.reason == "not published: MISSING_LEADER"


def test_a_sync_larger_than_a_link_frame_reaches_the_follower_in_parts(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """It was refused ("cannot sync ...: frame exceeds MAX_FRAME"), the follower's link
    dropped, and the follower asked again for ever: a member joining a cluster whose
    cache passed 64 MiB never became ready."""
    from cluster_link_pair import drain, open_pair

    from cluster import link_ops

    monkeypatch.setattr(link_ops, "MAX_FRAME", 20_000)
    coordinator = Coordinator()
    batches = [
        coordinator.apply_batch(
            700, [PublishRequest("x", i, Message(f"/s/{i % 7}", b"c" * 900))]
        )
        for i in range(60)
    ]
    stream = fed(new_stream(ring_size=2), batches)
    follower = Follower(stream, "n1", from_clsn=1)
    queued = []
    while True:
        try:
            queued.append(follower.receive.receive_nowait())
        except trio.WouldBlock:
            break
    assert "n1" in stream.followers  # not dropped
    # the sync is one queued item, built and written a part at a time
    (sync_item,) = [item for item in queued if isinstance(item, SyncFrames)]
    frames = list(sync_item.frames())
    _, connector = open_pair()
    events = []
    for frame in frames:
        assert len(frame) - 4 <= link_ops.MAX_FRAME
        connector.receive_data(frame)
        events += drain(connector)
    syncs = [e.sync for e in events if isinstance(e, link.Sync)]
    assert len(frames) > 3 and len(syncs) == 1
    assert syncs[0].clsn == 60
    assert sorted(len(r.cached) for r in syncs[0].subjects) == [8, 8, 8, 9, 9, 9, 9]
