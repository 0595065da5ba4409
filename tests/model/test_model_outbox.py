import pytest
from hypothesis import given
from hypothesis import strategies as st

from migratory.model.outbox import Outbox, OutboxBudget, SlowConsumer


def test_batch_space_triggers_flush() -> None:
    outbox = Outbox(batch_space=10, max_pending=100)
    assert not outbox and len(outbox) == 0
    assert outbox.enqueue(b"abcd") is False
    assert outbox.enqueue(b"efgh") is False
    assert outbox.enqueue(b"ij") is True  # exactly batch_space
    assert outbox.pending_bytes == 10 and len(outbox) == 3 and outbox
    assert outbox.take() == b"abcdefghij"
    assert outbox.pending_bytes == 0 and not outbox


def test_slow_consumer_leaves_outbox_unchanged() -> None:
    outbox = Outbox(batch_space=4, max_pending=10)
    outbox.enqueue(b"123456")
    with pytest.raises(SlowConsumer) as info:
        outbox.enqueue(b"12345")
    assert (info.value.pending_bytes, info.value.limit) == (11, 10)
    assert "11" in str(info.value) and "10" in str(info.value)
    assert outbox.pending_bytes == 6 and len(outbox) == 1
    outbox.enqueue(b"1234")  # exactly max_pending is allowed
    assert outbox.pending_bytes == 10


def test_single_frame_taken_without_copy() -> None:
    outbox = Outbox(batch_space=100, max_pending=100)
    frame = b"x" * 50
    outbox.enqueue(frame)
    assert outbox.take() is frame


def test_take_empty() -> None:
    assert Outbox(batch_space=1, max_pending=1).take() == b""


def test_requeue_unsent_goes_in_front() -> None:
    outbox = Outbox(batch_space=100, max_pending=20)
    outbox.enqueue(b"abc")
    outbox.enqueue(b"def")
    batch = outbox.take()
    outbox.enqueue(b"ghi")  # queued while the write was in progress
    outbox.requeue_unsent(batch[4:])
    assert outbox.pending_bytes == 5 and len(outbox) == 2
    assert outbox.take() == b"efghi"
    outbox.requeue_unsent(b"")
    assert not outbox


def test_empty_frames_ignored() -> None:
    outbox = Outbox(batch_space=1, max_pending=1)
    assert outbox.enqueue(b"") is False
    assert len(outbox) == 0


def test_constructor_validation() -> None:
    with pytest.raises(ValueError):
        Outbox(batch_space=0, max_pending=1)
    with pytest.raises(ValueError):
        Outbox(batch_space=1, max_pending=0)


def test_no_instance_dict() -> None:
    assert not hasattr(Outbox(batch_space=1, max_pending=1), "__dict__")


@given(
    st.lists(
        st.one_of(
            st.tuples(st.just("enqueue"), st.binary(max_size=30)),
            st.tuples(st.just("write"), st.integers(0, 80)),
        ),
        max_size=50,
    )
)
def test_everything_taken_equals_everything_enqueued(ops: list[tuple[str, object]]) -> None:
    outbox = Outbox(batch_space=40, max_pending=100)
    enqueued = bytearray()
    written = bytearray()
    for op, arg in ops:
        if op == "enqueue":
            assert isinstance(arg, bytes)
            before = outbox.pending_bytes
            try:
                full = outbox.enqueue(arg)
            except SlowConsumer:
                assert before + len(arg) > 100
                assert outbox.pending_bytes == before
                continue
            enqueued += arg
            assert full == (outbox.pending_bytes >= 40)
        else:
            assert isinstance(arg, int)
            batch = outbox.take()
            written += batch[:arg]
            outbox.requeue_unsent(batch[arg:])
        assert outbox.pending_bytes == len(enqueued) - len(written)
    written += outbox.take()
    assert bytes(written) == bytes(enqueued)


def test_discard_all_or_all_but_the_partially_written_first() -> None:
    outbox = Outbox(batch_space=100, max_pending=1000)
    outbox.enqueue(b"aaaa")
    batch = outbox.take()
    outbox.requeue_unsent(batch[1:])  # "aaa" left of a partial write
    outbox.enqueue(b"bb")
    outbox.enqueue(b"cc")
    assert outbox.discard(keep_first=True) == 4
    assert (outbox.pending_bytes, outbox.take()) == (3, b"aaa")
    outbox.enqueue(b"dd")
    assert outbox.discard() == 2
    assert not outbox and outbox.pending_bytes == 0


def test_discard_keeps_no_first_frame_of_which_nothing_was_written() -> None:
    # a write that took nothing (the socket full), or frames queued while a write of
    # their own is in flight (SendPath = io_uring): the close frame may follow at once
    outbox = Outbox(batch_space=100, max_pending=1000)
    outbox.enqueue(b"aaaa")
    outbox.enqueue(b"bbbb")
    batch = outbox.take()
    outbox.requeue_unsent(batch)  # nothing written
    assert outbox.discard(keep_first=True) == 8
    assert not outbox
    outbox.enqueue(b"cccc")  # queued behind a batch still in flight
    assert outbox.discard(keep_first=True) == 4
    outbox.enqueue(b"dddd")
    batch = outbox.take()
    outbox.requeue_unsent(batch)  # one frame, nothing written
    assert outbox.discard(keep_first=True) == 4


def test_discard_keeps_the_rest_of_a_single_frame_written_in_part() -> None:
    outbox = Outbox(batch_space=100, max_pending=1000)
    outbox.enqueue(b"abcdef")
    outbox.requeue_unsent(outbox.take()[2:])
    outbox.enqueue(b"gh")
    assert outbox.discard(keep_first=True) == 2
    assert outbox.take() == b"cdef"


def test_the_budget_keeps_the_largest_outbox_seen_at_batches_over_two_windows() -> None:
    """GET /metrics reads ``largest`` instead of walking every outbox: an outbox is
    looked at when its batch is taken, and when a frame fills its batch space (a client
    whose socket is full grows there), never per frame below that."""
    budget = OutboxBudget(OutboxBudget.UNLIMITED)
    quick = Outbox(batch_space=100, max_pending=10_000, budget=budget)
    stuck = Outbox(batch_space=100, max_pending=10_000, budget=budget)
    quick.enqueue(b"x" * 30)
    assert budget.largest == 0  # below the batch space: not looked at per frame
    quick.take()
    assert budget.largest == 30 and budget.used == 0
    for _ in range(12):  # never written: it grows past its batch space
        stuck.enqueue(b"y" * 50)
    assert budget.largest == 600 and budget.used == 600
    budget.next_window()
    assert budget.largest == 600  # the window before still counts
    quick.enqueue(b"x" * 10)
    quick.take()
    budget.next_window()
    assert budget.largest == 10  # two windows on: only what was seen since
    budget.next_window()
    assert budget.largest == 0
