"""The O(1) sizes the server bounds work with: cache bytes, merged snapshot size, and an
outbox that keeps only the cut frame's tail when a slow consumer is dropped."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from migratory.model.cache import SubjectCache, encoded_bound
from migratory.model.message import Message
from migratory.model.outbox import Outbox
from migratory.model.snapshot import merge_snapshot, merged_size
from migratory.protocol import websocket as ws

texts = st.text(max_size=8)
field_maps = st.dictionaries(st.sampled_from(["a", "b", "c", "é", "x" * 5]), texts, max_size=4)
retained_messages = st.builds(
    Message,
    subject=st.just("/s/t"),
    content=st.binary(max_size=20),
    fields=field_maps,
    retained=st.booleans(),
)


@given(st.lists(retained_messages, max_size=12))
def test_merged_size_is_the_size_of_the_merged_snapshot(messages: list[Message]) -> None:
    snapshot: Message | None = None
    for message in messages:
        merged = merge_snapshot(snapshot, message)
        expected = merged.size() if message.retained and merged is not None else 0
        assert merged_size(snapshot, message) == expected
        snapshot = merged


@given(
    st.lists(st.integers(min_value=0, max_value=300), min_size=1, max_size=40),
    st.integers(min_value=0, max_value=10),
    st.integers(min_value=1, max_value=50),
)
def test_cache_bytes_follow_appends_evictions_and_expiry(
    sizes: list[int], expire_after: int, count: int
) -> None:
    cache = SubjectCache(max_messages=10, expire_seconds=5)
    for seq, size in enumerate(sizes, start=1):
        cache.append(Message("/s/t", b"x" * size, epoch=1, seq=seq), now=float(seq))
        kept = cache.last(len(cache))
        assert cache.bytes == sum(encoded_bound(m) for m in kept)
        assert cache.bytes_of_newest(count) >= sum(encoded_bound(m) for m in cache.last(count))
    cache.expire(float(len(sizes) + expire_after))
    assert cache.bytes == sum(encoded_bound(m) for m in cache.last(len(cache)))


def test_a_cut_batch_keeps_only_the_tail_of_the_cut_frame() -> None:
    frames = [ws.encode_binary(bytes([i]) * 1000) for i in range(5)]
    for sent in (0, 1, 999, 1003, 1004, 2500, 5019):
        outbox = Outbox(batch_space=1 << 20, max_pending=1 << 20)
        for frame in frames:
            outbox.enqueue(frame)
        batch = outbox.take()
        outbox.requeue_unsent(batch[sent:])
        assert outbox.pending_bytes == len(batch) - sent
        outbox.discard(keep_first=True)
        tail = outbox.take()
        assert tail  # a frame was cut: its tail stays so a close frame lines up
        # what was sent plus the tail ends on a frame boundary
        decoder = ws.FrameDecoder(client_frames=False)
        events = decoder.events(batch[:sent] + tail)
        assert decoder.buffered == 0 and 1 <= len(events) <= 5
        assert len(tail) <= 1004
