"""benchmarks/uring_ring.py: the SEND SQE and io_uring_params layouts, and a ring that
sends over a socketpair (skipped, with the errno, where io_uring is not allowed)."""

from __future__ import annotations

import ctypes
import socket
import struct
import sys
import time
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))

from uring_ring import (
    IOSQE_ASYNC,
    Ring,
    RingError,
    RingLayout,
    UringSender,
    pack_send_sqe,
    setup_params,
)


def test_send_sqe_fields_sit_at_the_kernel_offsets() -> None:
    # include/uapi/linux/io_uring.h: opcode u8 @0, flags u8 @1, ioprio u16 @2, fd s32 @4,
    # off u64 @8, addr u64 @16, len u32 @24, msg_flags u32 @28, user_data u64 @32
    sqe = pack_send_sqe(fd=7, address=0x1122334455667788, length=154, user_data=9999)
    assert len(sqe) == 40
    assert sqe[0] == 26  # IORING_OP_SEND
    assert sqe[1:4] == b"\0\0\0"
    assert struct.unpack_from("<i", sqe, 4) == (7,)
    assert struct.unpack_from("<Q", sqe, 8) == (0,)
    assert struct.unpack_from("<Q", sqe, 16) == (0x1122334455667788,)
    assert struct.unpack_from("<II", sqe, 24) == (154, 0x4000)  # MSG_NOSIGNAL, no DONTWAIT
    assert struct.unpack_from("<Q", sqe, 32) == (9999,)


def test_send_sqe_carries_its_flags_in_byte_one() -> None:
    sqe = pack_send_sqe(fd=7, address=64, length=2, user_data=1, sqe_flags=IOSQE_ASYNC)
    assert sqe[1] == 0x10  # IOSQE_ASYNC_BIT 4: punt to io-wq
    assert sqe[0] == 26 and struct.unpack_from("<i", sqe, 4) == (7,)


def _ring(sq_entries: int, cq_entries: int, **options: object) -> Ring:
    try:
        return Ring(sq_entries, cq_entries, **options)  # type: ignore[arg-type]
    except RingError as error:
        pytest.skip(f"io_uring not allowed here: errno {error.errno} {error}")


def test_params_round_trip_the_setup_fields_and_offsets() -> None:
    raw = setup_params(flags=0b10, cq_entries=64, sq_thread_cpu=1, sq_idle_ms=5)
    assert len(raw) == 120
    assert struct.unpack_from("<5I", raw, 0) == (0, 64, 0b10, 1, 5)
    # what the kernel writes back: sq_off at byte 40, cq_off at byte 80
    answer = bytearray(raw)
    struct.pack_into("<IIIIII", answer, 0, 8, 16, 0, 0, 0, 1)
    struct.pack_into("<7I", answer, 40, 0, 4, 16, 24, 36, 40, 320)
    struct.pack_into("<6I", answer, 80, 8, 12, 20, 28, 44, 64)
    layout = RingLayout.from_params(bytes(answer))
    assert (layout.sq_entries, layout.cq_entries, layout.features) == (8, 16, 1)
    assert (layout.sq_head, layout.sq_tail, layout.sq_mask) == (0, 4, 16)
    assert (layout.sq_flags, layout.sq_array) == (36, 320)
    assert (layout.cq_head, layout.cq_tail, layout.cq_mask) == (8, 12, 20)
    assert (layout.cq_overflow, layout.cqes) == (44, 64)


@pytest.mark.parametrize(
    ("sqpoll", "sqe_flags"),
    [(True, 0), (False, 0), (False, IOSQE_ASYNC)],
    ids=["sqpoll", "enter", "async"],
)
def test_a_ring_sends_every_byte_and_completes_each_send_once(sqpoll: bool, sqe_flags: int) -> None:
    ring = _ring(8, 16, sqpoll=sqpoll, sq_idle_ms=1, sqe_flags=sqe_flags)
    if sqe_flags:
        ring.max_workers(1, 1)  # one io-wq worker does every send
    left, right = socket.socketpair()
    right.settimeout(5)
    buffers = [ctypes.create_string_buffer(b"%02d" % i, 2) for i in range(20)]
    completions: list[tuple[int, int]] = []
    try:
        for batch in range(4):  # 20 sends through 8 slots: the ring wraps twice
            for i in range(batch * 5, batch * 5 + 5):
                ring.prepare_send(left.fileno(), ctypes.addressof(buffers[i]), 2, 100 + i)
            ring.submit()
            deadline = time.monotonic() + 5
            while len(completions) < batch * 5 + 5 and time.monotonic() < deadline:
                ring.reap(completions)
                time.sleep(0.002)  # long enough for the SQ thread to sleep: wake-ups too
        received = b""
        while len(received) < 40:
            received += right.recv(64)
    finally:
        ring.close()
        left.close()
        right.close()
    assert received == b"".join(b"%02d" % i for i in range(20))
    assert sorted(completions) == [(100 + i, 2) for i in range(20)]


def test_io_wq_worker_caps_are_set_and_read_back() -> None:
    ring = _ring(8, 16, sqpoll=False)
    try:
        ring.max_workers(2, 1)
        assert ring.max_workers(0, 0) == (2, 1)  # 0 changes nothing, answers the caps
    finally:
        ring.close()


def test_a_sender_with_a_submit_interval_publishes_only_when_due_or_forced() -> None:
    ring = _ring(8, 16, sqpoll=False)
    left, right = socket.socketpair()
    right.settimeout(0.2)
    sender = UringSender([left], ring, b"ab", submit_every=60.0)
    try:
        sender.flush()  # the first flush is due: nothing to publish, the clock starts
        sender.send(0)
        sender.flush()  # not due for 60 s: the SQE stays unpublished
        with pytest.raises(TimeoutError):
            right.recv(8)
        assert sender.ring.enters == 0
        sender.flush(force=True)
        assert right.recv(8) == b"ab"
        assert sender.ring.enters == 1
    finally:
        sender.close()
        left.close()
        right.close()
