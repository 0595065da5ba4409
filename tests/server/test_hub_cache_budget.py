"""``CacheMemoryBudget`` in the hub: the oldest cached messages of all subjects go first,
a resume from one of them is a resync, and the counts stay right."""

from __future__ import annotations

from test_hub import RecordingSink

from migratory.model.cache_budget import ENTRY_OVERHEAD, QUEUE_OVERHEAD
from migratory.model.message import Message
from migratory.model.position import Position
from migratory.protocol import ops
from migratory.server.hub import Hub

ONE = ENTRY_OVERHEAD + len("/hot/x") + 10  # what a 10-byte message on /hot/x counts
QUEUE = QUEUE_OVERHEAD  # a subject caching two messages or more holds a deque


def test_past_the_budget_the_oldest_message_of_any_subject_goes_first() -> None:
    hub = Hub(epoch=5, cache_memory_budget=4 * ONE + QUEUE)
    hub.subscribe(RecordingSink(), ops.SubscriptionRequest("/cold/x"), 0.0)
    hub.publish(Message("/cold/x", b"0123456789", retained=True), 0.0)
    for i in range(4):
        hub.publish(Message("/hot/x", b"%010d" % i), 1.0)
    stats = hub.statistics()
    assert stats.cached_messages == 4 and stats.cache_evicted == 1
    assert stats.cache_bytes == 4 * ONE + QUEUE
    # the cold subject's only message went; a resume from before it is told so
    out = hub.subscribe(RecordingSink(), ops.SubscriptionRequest(
        "/cold/x", position=Position(5, 0)), 2.0)
    assert out[-1] == ops.SubjectStatus(ops.Status.DATA_RESYNC, "/cold/x", Position(5, 1))
    # the hot subject keeps its newest four, and serves a resume within them
    out = hub.subscribe(RecordingSink(), ops.SubscriptionRequest(
        "/hot/x", position=Position(5, 1)), 2.0)
    assert [m.seq for m in out[1].messages] == [2, 3, 4]  # type: ignore[union-attr]
    assert out[-1] == ops.SubjectStatus(ops.Status.DATA_SYNC, "/hot/x", Position(5, 4))


def test_without_a_budget_nothing_is_counted_or_dropped() -> None:
    hub = Hub(epoch=5)
    for i in range(50):
        hub.publish(Message(f"/s/{i}", b"x" * 1000), 0.0)
    stats = hub.statistics()
    assert (stats.cached_messages, stats.cache_bytes, stats.cache_evicted) == (50, 0, 0)


def test_a_reposition_gives_the_old_cache_back_to_the_budget() -> None:
    hub = Hub(epoch=5, cache_memory_budget=100 * ONE, numbered_elsewhere=True)
    for seq in range(1, 4):
        hub.apply(Message("/hot/x", b"%010d" % seq, epoch=7, seq=seq), 0.0)
    assert hub.statistics().cache_bytes == 3 * ONE + QUEUE
    cached = [Message("/hot/x", b"%010d" % seq, epoch=8, seq=seq) for seq in (9, 10)]
    hub.reposition("/hot/x", Position(8, 10), None, cached, 1.0)
    stats = hub.statistics()
    assert (stats.cached_messages, stats.cache_bytes) == (2, 2 * ONE + QUEUE)
