"""A member taking a cache sync from a peer over a link: the event loop keeps turning
while it installs it, and a seed asking a peer seed for one skips the heartbeats that
come first (cluster/stream.py ``install_sync_in_slices``, cluster/upstream.py,
cluster/seed.py ``_sync_from``).

Counted, not timed: the turns of the event loop seen while the sync was half
installed, and what every live subscriber received.
"""

from __future__ import annotations

import contextlib
import logging
from pathlib import Path

import pytest
import trio
import trio.testing

from cluster import link
from cluster.cache_sync import CacheSync
from cluster.coordination import UNNUMBERED_EPOCH, CommittedBatch, Coordinator, PublishRequest
from cluster.forwarding import Outgoing
from cluster.link_io import LinkChannel
from cluster.publishing import ClusterPublishing
from cluster.replica import Offer, Replica
from cluster.seed import SeedCoordination
from cluster.stream import CommittedStream
from cluster.tooling import free_base_port, member_settings
from cluster.upstream import LeaveUpstream, UpstreamReplication
from migratory.config import load_config
from migratory.model.message import Message
from migratory.model.position import Position
from migratory.server.hub import Hub

PASSWORD = "s3cret"
SUBJECTS = tuple(f"/s/{i}" for i in range(40))
SYNC_AT = 60  # clsn of the sync: every subject at seq 60, 60 cached messages each
JOINER_AT = 10  # what the member taking it had applied before


def batches(count: int) -> list[CommittedBatch]:
    """``count`` committed batches, one message of every subject in each."""
    coordinator = Coordinator()
    return [
        coordinator.apply_batch(
            700, [PublishRequest("a", i * len(SUBJECTS) + k, Message(s, b"%d" % i))
                  for k, s in enumerate(SUBJECTS)]
        )
        for i in range(count)
    ]


def new_stream() -> CommittedStream:
    replica = Replica(Hub(epoch=UNNUMBERED_EPOCH))
    return CommittedStream(ClusterPublishing(origin="me#1", replica=replica))


def fed(stream: CommittedStream, committed: list[CommittedBatch]) -> CommittedStream:
    for batch in committed:
        assert stream.on_committed(batch, 0.0) is Offer.APPLIED
    return stream


def sync_at(committed: list[CommittedBatch]) -> CacheSync:
    sync = fed(new_stream(), committed).replica.make_sync()
    assert sync is not None
    return sync


async def channel_pair() -> tuple[LinkChannel, LinkChannel]:
    left, right = trio.testing.memory_stream_pair()
    peer = LinkChannel(left, role="accept", member="10.0.0.1:1", password=PASSWORD)
    member = LinkChannel(right, role="connect", member="10.0.0.2:1", password=PASSWORD)
    async with trio.open_nursery() as nursery:
        nursery.start_soon(peer.handshake)
        nursery.start_soon(member.handshake)
    return peer, member


class Listener:
    """A live subscriber of one subject: the seqs it was given, in order."""

    def __init__(self) -> None:
        self.seqs: list[int] = []

    def deliver_message(self, message: Message, qos: int) -> None:
        self.seqs.append(message.seq)


def test_a_non_seed_installs_a_large_sync_a_slice_at_a_time(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Installed at once, the default CacheMemoryBudget's ~660,000 cached messages
    stopped the member's event loop for 0.7-2 s (nothing else ran: no client, no link
    heartbeat). Now the loop turns between slices; no subject is ever seen half
    installed, the member stays not whole until the last slice, and the batch sent
    after the sync is applied after it: every live subscriber gets each seq once, in
    order. 2,400 cached messages in slices of 100."""
    monkeypatch.setattr("cluster.stream.SLICE_MESSAGES", 100, raising=False)
    committed = batches(SYNC_AT + 1)
    sync = sync_at(committed[:SYNC_AT])
    stream = new_stream()
    hub, replica = stream.replica.hub, stream.replica
    listeners = {s: Listener() for s in SUBJECTS}
    for subject, listener in listeners.items():
        hub.listen(listener, subject, 1)
    fed(stream, committed[:JOINER_AT])
    upstream = UpstreamReplication(
        name="10.0.0.2:1", seeds=[("10.0.0.1", 1)], password=PASSWORD, stream=stream,
        outgoing=Outgoing(stream.publishing), max_frame=link.MAX_FRAME)
    halfway: list[int] = []  # subjects installed, at each turn of the loop mid-install

    async def watch() -> None:
        for _ in range(10_000):
            at = {hub.position(s) for s in SUBJECTS}
            assert at <= {Position(700, JOINER_AT), Position(700, SYNC_AT),
                          Position(700, SYNC_AT + 1)}  # each subject whole, before or after
            installed = sum(hub.position(s) == Position(700, SYNC_AT) for s in SUBJECTS)
            if 0 < installed < len(SUBJECTS):
                halfway.append(installed)
                assert replica.needs_sync and replica.applied_clsn == JOINER_AT
                assert isinstance(stream.sync_for(0), link.SyncRefused)  # nothing half given
            if replica.applied_clsn == SYNC_AT + 1:
                return
            await trio.sleep(0)

    async def seed(channel: LinkChannel) -> None:
        assert isinstance(await channel.receive(), link.Replicate)
        for frame in link.sync_frames(sync):
            await channel.send_encoded(frame)
        await channel.send(link.Batch(committed[SYNC_AT]))
        await channel.send(link.Heartbeat(SYNC_AT + 1, True))

    async def main() -> None:
        peer, member = await channel_pair()
        async with trio.open_nursery() as nursery:
            nursery.start_soon(seed, peer)
            nursery.start_soon(watch)
            replicate = upstream.start_link("10.0.0.1:1", trio.current_time())
            with pytest.raises(ExceptionGroup) as ended:  # the seed stops talking
                await upstream._replicate("10.0.0.1:1", member, replicate)
            assert ended.group_contains(LeaveUpstream)
            nursery.cancel_scope.cancel()

    trio.run(main, clock=trio.testing.MockClock(autojump_threshold=0))
    assert len(halfway) >= 10, halfway  # at once: never seen halfway
    assert halfway == sorted(halfway)
    assert replica.applied_clsn == SYNC_AT + 1 and not replica.needs_sync
    assert upstream.view.heartbeat_clsn == SYNC_AT + 1
    for subject, listener in listeners.items():
        assert listener.seqs == list(range(1, SYNC_AT + 2)), subject  # no gap, no repeat


def seed_config(tmp_path: Path) -> object:
    settings = member_settings(
        0, members=4, seeds=3, mode="Guaranteed", base_port=free_base_port(4),
        password=PASSWORD, data_dir=tmp_path / "data",
    )
    return load_config(overrides=settings, environ={})


@pytest.mark.parametrize("heartbeats, installed", [(3, True), (41, False)])
def test_a_seed_asking_a_peer_for_a_sync_skips_the_heartbeats_before_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture,
    heartbeats: int, installed: bool,
) -> None:
    """The peer's link writer sends a heartbeat every 0.25 s while it has nothing to
    send; the seed took the first operation after its ``SyncRequest`` for the answer,
    gave up on a heartbeat and tried again 0.3 s later. Now heartbeats are skipped, up
    to 40 (10 s of them): past that the attempt ends."""
    caplog.set_level(logging.INFO, "migratory.cluster")
    committed = batches(3)
    sync = sync_at(committed[:2])
    stream = new_stream()
    assert stream.on_committed(committed[2], 0.0) is Offer.GAP  # batches 1-2 never came
    seed = SeedCoordination(config=seed_config(tmp_path), name="10.0.0.2:1", stream=stream,
                            outgoing=Outgoing(stream.publishing))
    asked: list[int] = []

    async def peer(channel: LinkChannel) -> None:
        request = await channel.receive()
        assert isinstance(request, link.SyncRequest)
        asked.append(request.min_clsn)
        with contextlib.suppress(trio.BrokenResourceError):  # the seed gave up first
            for _ in range(heartbeats):
                await channel.send(link.Heartbeat(2, True))
            await channel.send(link.Sync(sync))

    async def main() -> None:
        channel, member = await channel_pair()

        async def connect(*args: object, **kwargs: object) -> LinkChannel:
            return member

        monkeypatch.setattr("cluster.seed.connect", connect)
        async with trio.open_nursery() as nursery:
            nursery.start_soon(peer, channel)
            await seed._sync_from(("10.0.0.1", 1))
            nursery.cancel_scope.cancel()

    trio.run(main, clock=trio.testing.MockClock(autojump_threshold=0))
    assert asked == [2]
    assert stream.replica.needs_sync is not installed
    if installed:  # the sync, then the held-back batch after it
        assert stream.replica.applied_clsn == 3
    else:
        assert "41 heartbeats and no answer" in caplog.text


def test_a_seed_installs_a_raft_dump_a_slice_at_a_time(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture,
) -> None:
    """A Raft dump (a seed restarting from its own, or sent the leader's) was installed
    at once in the callback that handed it over: the default CacheMemoryBudget's
    ~660,000 cached messages stopped the seed's loop ~1 s (docs/benchmarks.md). Now the
    callback begins the install, so the batch handed over right after it is held back
    behind it -- not taken for a gap that a peer seed's sync must fill -- and the loop
    turns between slices; every live subscriber gets each seq once, in order. 2,400
    cached messages in slices of 100."""
    caplog.set_level(logging.INFO, "migratory.cluster")
    monkeypatch.setattr("cluster.stream.SLICE_MESSAGES", 100, raising=False)
    committed = batches(SYNC_AT + 1)
    dump = sync_at(committed[:SYNC_AT])
    stream = new_stream()
    hub, replica = stream.replica.hub, stream.replica
    listeners = {s: Listener() for s in SUBJECTS}
    for subject, listener in listeners.items():
        hub.listen(listener, subject, 1)
    fed(stream, committed[:JOINER_AT])
    seed = SeedCoordination(config=seed_config(tmp_path), name="10.0.0.2:1", stream=stream,
                            outgoing=Outgoing(stream.publishing))
    halfway: list[int] = []

    async def main() -> None:
        async with trio.open_nursery() as nursery:
            seed._nursery = nursery
            seed._restored(dump)  # as the Raft thread hands them over: the dump,
            seed._committed(committed[SYNC_AT])  # then the batch after it
            assert not seed.syncing  # held behind the dump: no peer seed asked
            for _ in range(10_000):
                installed = sum(hub.position(s) == Position(700, SYNC_AT) for s in SUBJECTS)
                if 0 < installed < len(SUBJECTS):
                    halfway.append(installed)
                    assert replica.needs_sync and replica.applied_clsn == JOINER_AT
                if replica.applied_clsn == SYNC_AT + 1:
                    break
                await trio.sleep(0)
            nursery.cancel_scope.cancel()

    trio.run(main, clock=trio.testing.MockClock(autojump_threshold=0))
    assert len(halfway) >= 10, halfway  # at once: never seen halfway
    assert replica.applied_clsn == SYNC_AT + 1 and not replica.needs_sync
    assert not seed.syncing
    assert "caches restored from the Raft dump at clsn 60 (40 subjects, 41 slices)" in caplog.text
    for subject, listener in listeners.items():
        assert listener.seqs == list(range(1, SYNC_AT + 2)), subject  # no gap, no repeat
