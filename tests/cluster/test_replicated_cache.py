"""The caches in the seeds' replicated state: what a Raft dump carries."""

from __future__ import annotations

import gc
import pickle

from cluster.replicated_cache import ReplicatedCache
from migratory.model.message import Message, MessageType, Qos


def message(subject: str, seq: int, epoch: int = 3, retained: bool = True) -> Message:
    return Message(subject, b"c%d" % seq, {"n": str(seq)}, retained, Qos.GUARANTEED, None,
                   epoch, seq, MessageType.UPDATE)


def test_keeps_the_last_messages_and_the_merged_snapshot_per_subject() -> None:
    cache = ReplicatedCache(max_messages=2)
    cache.append([message("/a/b", s) for s in (1, 2, 3)] + [message("/c/d", 1, retained=False)])
    sync = cache.to_sync(9, {"/a/b": (3, 3), "/c/d": (3, 1)})
    assert sync.clsn == 9
    by_subject = {s.subject: s for s in sync.subjects}
    assert by_subject["/a/b"].cached == (message("/a/b", 2), message("/a/b", 3))
    assert by_subject["/a/b"].snapshot is not None and by_subject["/a/b"].snapshot.seq == 3
    assert by_subject["/c/d"].cached == (message("/c/d", 1, retained=False),)
    assert by_subject["/c/d"].snapshot is None


def test_a_new_epoch_drops_the_older_lineage() -> None:
    cache = ReplicatedCache()
    cache.append([message("/a/b", 1, epoch=3), message("/a/b", 1, epoch=4)])
    (subject,) = cache.to_sync(2, {"/a/b": (4, 1)}).subjects
    assert subject.cached == (message("/a/b", 1, epoch=4),)


def test_a_position_of_another_epoch_gets_no_messages() -> None:
    cache = ReplicatedCache()
    cache.append([message("/a/b", 1, epoch=3)])
    (subject,) = cache.to_sync(1, {"/a/b": (8, 4)}).subjects
    assert subject.cached == () and subject.snapshot is None


def test_pickle_round_trip_and_a_dump_from_before_packing() -> None:
    cache = ReplicatedCache(max_messages=5)
    cache.append([message("/a/b", s) for s in (1, 2)])
    positions = {"/a/b": (3, 2)}
    restored = pickle.loads(pickle.dumps(cache))
    assert restored.to_sync(2, positions) == cache.to_sync(2, positions)
    old_state = {  # what an older member's dump holds: Message objects
        "max_messages": 5,
        "cached": {"/a/b": (message("/a/b", 1), message("/a/b", 2))},
        "snapshots": cache.__getstate__()["snapshots"],
    }
    old = ReplicatedCache.__new__(ReplicatedCache)
    old.__setstate__(old_state)
    assert old.to_sync(2, positions) == cache.to_sync(2, positions)


def test_cached_messages_are_not_tracked_by_the_collector() -> None:
    """50,000 tracked messages made a seed's full collections stop it ~180 ms (issue 8)."""
    cache = ReplicatedCache(max_messages=1000)
    gc.collect()
    before = sum(isinstance(o, Message) for o in gc.get_objects())
    cache.append([message(f"/s/{i % 10}", i // 10 + 1, retained=False) for i in range(5000)])
    gc.collect()
    assert sum(isinstance(o, Message) for o in gc.get_objects()) == before
