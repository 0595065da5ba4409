"""A cache sync in parts on a real link channel: written a part at a time with the event
loop running between parts, in queue order, and not taken for silence while its bytes
come (cluster/peers.py ``_write_some``, cluster/link_io.py ``receive_within``)."""

from __future__ import annotations

import pytest
import trio
import trio.testing

from cluster import link
from cluster.cache_sync import SyncCapture
from cluster.link_io import LinkChannel
from cluster.link_sync import SyncFrames
from cluster.peers import PeerService
from cluster.stream import Backlog, Outbound
from migratory.model.cache import SubjectCache
from migratory.model.message import Message
from migratory.model.position import Position

PASSWORD = "s3cret"


async def channel_pair() -> tuple[LinkChannel, LinkChannel]:
    left, right = trio.testing.memory_stream_pair()
    sender = LinkChannel(left, role="accept", member="10.0.0.1:1", password=PASSWORD)
    receiver = LinkChannel(right, role="connect", member="10.0.0.2:1", password=PASSWORD)
    async with trio.open_nursery() as nursery:
        nursery.start_soon(sender.handshake)
        nursery.start_soon(receiver.handshake)
    return sender, receiver


def capture(subjects: int, messages: int) -> SyncCapture:
    runs = []
    for s in range(subjects):
        subject = f"/s/{s}"
        cache = SubjectCache(max_messages=1000, expire_seconds=60)
        for seq in range(1, messages + 1):
            cache.append(Message(subject, b"c" * 500, {}, epoch=9, seq=seq), 0.0)
        runs.append((subject, Position(9, messages), None, cache.run()))
    return SyncCapture(40, tuple(runs))


def test_a_sync_is_written_a_part_at_a_time_in_queue_order() -> None:
    async def main() -> None:
        sender, receiver = await channel_pair()
        beat = link.encode_frame(link.Heartbeat(39, True))
        sync = SyncFrames(capture(20, 30), part_bytes=4_000)  # ~300,000 bytes: ~75 parts
        send, queue = trio.open_memory_channel[Outbound](10)
        for frame in (beat, sync, beat):
            send.send_nowait(frame)
        ticks = 0

        async def ticker() -> None:
            nonlocal ticks
            while True:
                ticks += 1
                await trio.sleep(0)

        got: list[link.LinkOp | None] = []

        async def read() -> None:
            for _ in range(3):
                got.append(await receiver.receive())

        async with trio.open_nursery() as nursery:
            nursery.start_soon(ticker)
            async with trio.open_nursery() as io:
                io.start_soon(read)
                for _ in range(2):  # what PeerService._write does with each taken item
                    item: Outbound | None = queue.receive_nowait()
                    while item is not None:
                        item = await PeerService._write_some(sender, queue, item, Backlog())
            nursery.cancel_scope.cancel()
        assert got[0] == link.Heartbeat(39, True) and got[2] == link.Heartbeat(39, True)
        assert isinstance(got[1], link.Sync)
        assert got[1].sync == sync.capture.whole()
        assert len(list(sync.frames())) > 50
        assert ticks > 50  # the loop ran between parts (built all at once: a handful)

    trio.run(main, clock=trio.testing.MockClock(autojump_threshold=0))


async def dribble(sender: LinkChannel, data: bytes, pause: float) -> None:
    for start in range(0, len(data), 1000):
        await sender.stream.send_all(data[start:start + 1000])
        await trio.sleep(pause)


def big_sync_frames() -> bytes:
    return b"".join(SyncFrames(capture(5, 20), part_bytes=3_000).frames())


def test_a_sync_still_coming_is_not_silence() -> None:
    async def main() -> None:
        sender, receiver = await channel_pair()
        data = big_sync_frames()
        assert len(data) > 30_000  # 30 pauses of 1.5 s: 45 s in all, against 2 s
        async with trio.open_nursery() as nursery:
            nursery.start_soon(dribble, sender, data, 1.5)
            op = await receiver.receive_within(2.0)
        assert isinstance(op, link.Sync)

    trio.run(main, clock=trio.testing.MockClock(autojump_threshold=0))


def test_no_byte_for_the_silence_is_too_slow() -> None:
    async def main() -> None:
        sender, receiver = await channel_pair()
        async with trio.open_nursery() as nursery:
            nursery.start_soon(dribble, sender, big_sync_frames(), 2.5)
            with pytest.raises(trio.TooSlowError):
                await receiver.receive_within(2.0)
            nursery.cancel_scope.cancel()

    trio.run(main, clock=trio.testing.MockClock(autojump_threshold=0))
