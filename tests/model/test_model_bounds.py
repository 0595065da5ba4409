"""The O(1) sizes the server bounds work with: cache bytes, merged snapshot size, and an
outbox that keeps only the cut frame's tail when a slow consumer is dropped."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from migratory.model.cache import SubjectCache, encoded_bound
from migratory.model.message import Message
from migratory.model.outbox import Outbox, OutboxBudget, SlowConsumer
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
        if sent % len(frames[0]):
            assert tail  # a frame was cut: its tail stays so a close frame lines up
        else:
            assert not tail  # the write ended on a boundary: no frame begun, none kept
        # what was sent plus the tail ends on a frame boundary
        decoder = ws.FrameDecoder(client_frames=False)
        events = decoder.events(batch[:sent] + tail)
        assert decoder.buffered == 0 and (1 if sent else 0) <= len(events) <= 5
        assert len(tail) <= 1004


@given(st.lists(st.tuples(st.integers(0, 2), st.sampled_from(["enqueue", "unbounded", "take",
                                                               "requeue", "discard"]),
                          st.integers(0, 3000)), max_size=60))
def test_the_outbox_budget_counts_what_every_outbox_holds(steps: list[tuple[int, str, int]]
                                                          ) -> None:
    budget = OutboxBudget(1 << 30)
    outboxes = [Outbox(batch_space=4096, max_pending=1 << 20, budget=budget) for _ in range(3)]
    for index, action, size in steps:
        outbox = outboxes[index]
        if action == "enqueue":
            outbox.enqueue(ws.encode_binary(b"x" * size))
        elif action == "unbounded":
            outbox.enqueue_unbounded(ws.encode_binary(b"y" * size))
        elif action == "take":
            outbox.take()
        elif action == "requeue" and outbox:
            batch = outbox.take()
            outbox.requeue_unsent(batch[min(size, len(batch)):])
        elif action == "discard":
            outbox.discard(keep_first=size % 2 == 1)
        assert budget.used == sum(o.pending_bytes for o in outboxes)


def test_past_the_budget_only_a_client_that_is_behind_is_cut_off() -> None:
    budget = OutboxBudget(100_000)
    behind = Outbox(batch_space=1 << 20, max_pending=160_000, budget=budget)
    keeping_up = Outbox(batch_space=1 << 20, max_pending=160_000, budget=budget)
    frame = ws.encode_binary(b"z" * 9_000)
    for _ in range(11):
        behind.enqueue(frame)  # 99 kB: the budget is nearly spent
    with pytest.raises(SlowConsumer):
        behind.enqueue(frame)
    keeping_up.enqueue(frame)  # 9 kB pending, under a sixteenth of its limit: taken
    assert budget.used == behind.pending_bytes + keeping_up.pending_bytes > budget.limit
    behind.discard()
    behind.enqueue(frame)
    assert budget.used == 2 * len(frame)
