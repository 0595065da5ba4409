"""The ring of recent committed batches: bounded, gap-free, packed out of the collector's sight."""

from __future__ import annotations

import gc

import pytest

from cluster.batch_ring import BatchRing
from cluster.coordination import CommittedBatch
from migratory.model.message import Message, MessageType, Qos


def batch(clsn: int, size: int = 2) -> CommittedBatch:
    messages = tuple(
        Message(f"/s/{i}", b"m%d" % clsn, {"f": str(i)}, i == 0, Qos.GUARANTEED, None, 5,
                clsn * size + i, MessageType.UPDATE)
        for i in range(size)
    )
    origins = tuple((f"m{i}", clsn * 10 + i) for i in range(size))
    return CommittedBatch(clsn, messages, origins, (("m0", clsn * 10 - 9, 5, 1),) * (clsn % 2))


def test_gives_back_the_batches_after_a_clsn_as_committed() -> None:
    ring = BatchRing()
    batches = [batch(c) for c in range(1, 6)]
    for b in batches:
        ring.append(b)
    assert ring.first_clsn == 1 and len(ring) == 5
    assert list(ring.after(2)) == batches[2:]  # repeats too: a follower caught up is answered
    assert [b.repeats for b in ring.after(2)] == [b.repeats for b in batches[2:]] != [()] * 3
    assert list(ring.after(5)) == []
    assert list(ring.after(0)) == batches


def test_bounded_by_batches_and_by_messages() -> None:
    by_batches = BatchRing(max_batches=3, max_messages=1000)
    by_messages = BatchRing(max_batches=1000, max_messages=7)
    for c in range(1, 11):
        by_batches.append(batch(c, size=2))
        by_messages.append(batch(c, size=2))
    assert [b.clsn for b in by_batches.after(0)] == [8, 9, 10]
    assert [b.clsn for b in by_messages.after(0)] == [8, 9, 10]  # 6 messages <= 7


def test_one_batch_larger_than_the_message_bound_is_still_kept() -> None:
    ring = BatchRing(max_messages=3)
    ring.append(batch(1, size=2))
    ring.append(batch(2, size=10))
    assert [b.clsn for b in ring.after(0)] == [2]


def test_a_jump_clears_what_no_longer_leads_up_to_it() -> None:
    ring = BatchRing()
    ring.append(batch(1))
    ring.append(batch(2))
    ring.append(batch(7))  # after a sync: 3..6 were never seen here
    assert ring.first_clsn == 7 and len(ring) == 1


def test_empty_ring_and_bad_bounds() -> None:
    assert BatchRing().first_clsn is None
    with pytest.raises(ValueError, match="at least one batch"):
        BatchRing(max_batches=0)


def test_kept_batches_leave_no_tracked_message_behind() -> None:
    """What made a seed's full collections walk ~50,000 messages (issue 8)."""
    ring = BatchRing()
    gc.collect()
    before = sum(isinstance(o, Message | CommittedBatch) for o in gc.get_objects())
    for c in range(1, 501):
        ring.append(batch(c, size=4))
    gc.collect()
    after = sum(isinstance(o, Message | CommittedBatch) for o in gc.get_objects())
    assert len(ring) == 500
    assert after - before == 0


def big(clsn: int, content: bytes) -> CommittedBatch:
    message = Message("/big/one", content, {}, False, Qos.GUARANTEED, None, 5, clsn,
                      MessageType.UPDATE)
    return CommittedBatch(clsn, (message,), (("m", clsn),))


def test_bounded_by_bytes_with_the_default_bounds() -> None:
    """200 batches of one 1 MiB message were all kept (below 20,000 batches and 100,000
    messages): 100,000 messages of 128 KiB would have been 12.8 GB on a seed."""
    ring = BatchRing()
    content = b"x" * (1 << 20)
    for clsn in range(1, 201):
        ring.append(big(clsn, content))
    assert ring.bytes <= 64 * (1 << 20) + 1000
    assert len(ring) == 63 and ring.first_clsn == 138  # 1 MiB + 8 subject bytes each
    assert [b.clsn for b in ring.after(198)] == [199, 200]


def test_one_batch_larger_than_the_byte_bound_is_still_kept() -> None:
    ring = BatchRing(max_bytes=100)
    ring.append(big(1, b"x" * 500))
    ring.append(big(2, b"x" * 500))
    assert len(ring) == 1 and ring.first_clsn == 2 and ring.bytes == 500 + len("/big/one")
    ring.clear()
    assert ring.bytes == 0
