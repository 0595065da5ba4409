"""A cache sync larger than one link frame goes as parts and comes out whole
(cluster/link_sync.py, LinkConnection)."""

from __future__ import annotations

import pytest
from cluster_link_pair import drain, open_pair
from hypothesis import given, settings
from hypothesis import strategies as st

from cluster import link
from cluster.cache_sync import CacheSync, SubjectSync
from cluster.link import LinkError
from cluster.link_sync import SyncAssembly, message_bytes, sync_frames, sync_parts
from migratory.model.message import Message, MessageType

EPOCH = 77


def record(subject: str, seq: int, sizes: list[int], retained: bool = False) -> SubjectSync:
    first = seq - len(sizes) + 1
    cached = tuple(
        Message(subject, b"c" * size, {"k": str(n)}, epoch=EPOCH, seq=first + n,
                type=MessageType.UPDATE)
        for n, size in enumerate(sizes)
    )
    snapshot = (
        Message(subject, b"s", {"a": "1"}, True, epoch=EPOCH, seq=seq, type=MessageType.UPDATE)
        if retained else None
    )
    return SubjectSync(subject, EPOCH, seq, snapshot, cached)


def through_link(frames: list[bytes], *, one_byte: bool = False) -> list[object]:
    _, connector = open_pair()
    events: list[object] = []
    for frame in frames:
        chunks = [frame[i:i + 1] for i in range(len(frame))] if one_byte else [frame]
        for chunk in chunks:
            connector.receive_data(chunk)
            events += drain(connector)
    return events


def test_a_sync_larger_than_a_frame_arrives_whole() -> None:
    # one subject whose cached messages alone pass MAX_FRAME (600 x 128 KiB = 78 MB):
    # the encoder refused it ("exceeds MAX_FRAME") and the member never synced
    big = b"x" * 131_072
    cached = tuple(
        Message("/big/one", big, {}, epoch=EPOCH, seq=n, type=MessageType.UPDATE)
        for n in range(1, 601)
    )
    sync = CacheSync(9, (SubjectSync("/big/one", EPOCH, 600, None, cached),
                         record("/small/two", 3, [10, 10])))
    frames = sync_frames(sync)
    assert len(frames) > 1
    assert all(len(f) - 4 <= link.MAX_FRAME for f in frames)
    assert through_link(frames) == [link.Sync(sync)]


def test_a_sync_that_fits_is_the_one_sync_frame_older_members_read() -> None:
    sync = CacheSync(4, (record("/a/b", 5, [10, 20], retained=True),))
    assert sync_frames(sync) == [link.encode_frame(link.Sync(sync))]


syncs = st.lists(
    st.tuples(st.lists(st.integers(0, 300), max_size=12), st.booleans()), max_size=8
).map(lambda specs: CacheSync(
    11, tuple(record(f"/s/{i}", len(sizes) + 5, sizes, retained)
              for i, (sizes, retained) in enumerate(specs))))


@settings(max_examples=150, deadline=None)
@given(sync=syncs, part_bytes=st.integers(100, 2_000))
def test_parts_put_together_are_the_sync(sync: CacheSync, part_bytes: int) -> None:
    parts = sync_parts(sync, part_bytes)
    assert [p.last for p in parts] == [False] * (len(parts) - 1) + [True]
    for part in parts:
        messages = [m for r in part.subjects for m in r.cached]
        estimate = sum(map(message_bytes, messages))
        assert estimate <= part_bytes or len(messages) == 1
    assembly = SyncAssembly()
    out = [assembly.add(p) for p in parts]
    assert out[:-1] == [None] * (len(parts) - 1)
    assert out[-1] == sync
    assert not assembly.open


def test_a_subject_whole_in_one_part_is_not_copied_when_the_parts_are_put_together() -> None:
    """Rebuilding every subject's record from a list when the last part came stopped the
    taker's loop ~60 ms for 500,000 cached messages; only a subject split across parts
    needs joining (here /s/1, across four parts)."""
    sync = CacheSync(3, (record("/s/0", 4, [100] * 4), record("/s/1", 14, [100] * 14),
                         record("/s/2", 2, [10] * 2)))
    parts = sync_parts(sync, 1_000)
    assert [[(r.subject, len(r.cached)) for r in p.subjects] for p in parts] == [
        [("/s/0", 4), ("/s/1", 1)], [("/s/1", 5)], [("/s/1", 5)], [("/s/1", 3), ("/s/2", 2)],
    ]
    assembly = SyncAssembly()
    (whole,) = [out for p in parts if (out := assembly.add(p)) is not None]
    assert whole == sync
    assert whole.subjects[0] is parts[0].subjects[0]
    assert whole.subjects[2] is parts[-1].subjects[-1]


def test_parts_fed_one_byte_at_a_time_and_followed_by_a_batch() -> None:
    sync = CacheSync(3, tuple(record(f"/s/{i}", 40, [200] * 30) for i in range(5)))
    frames = [link.encode_frame(p) for p in sync_parts(sync, 3_000)]
    assert len(frames) > 5
    heartbeat = link.Heartbeat(3, True)
    events = through_link([*frames, link.encode_frame(heartbeat)], one_byte=True)
    assert events == [link.Sync(sync), heartbeat]


def part(clsn: int, records: tuple[SubjectSync, ...], last: bool) -> link.SyncPart:
    return link.SyncPart(clsn, records, last)


def test_an_operation_between_parts_ends_the_link() -> None:
    first = link.encode_frame(part(3, (record("/a/b", 2, [1]),), False))
    with pytest.raises(LinkError, match="Heartbeat in the middle of a cache sync"):
        through_link([first, link.encode_frame(link.Heartbeat(3, True))])


@pytest.mark.parametrize(
    ("second", "reason"),
    [
        (part(4, (record("/c/d", 1, [1]),), True), "at clsn 4 within a sync at clsn 3"),
        (part(3, (record("/a/b", 3, [1]),), True), "another position"),
        (part(3, (record("/a/b", 2, [1], retained=True),), True), "a second snapshot"),
        (part(3, (record("/c/d", 1, [1]), record("/a/b", 2, [1])), True), "comes twice"),
    ],
)
def test_parts_that_do_not_go_on_from_the_ones_before_are_refused(
    second: link.SyncPart, reason: str
) -> None:
    first = link.encode_frame(part(3, (record("/a/b", 2, [1]),), False))
    with pytest.raises(LinkError, match=reason):
        through_link([first, link.encode_frame(second)])
