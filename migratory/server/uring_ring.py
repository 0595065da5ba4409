"""A minimal io_uring for socket sends, in ctypes: raw syscalls, no liburing.

Used by the server's ``SendPath = io_uring`` (:mod:`migratory.server.uring_writer`) and by
``benchmarks/uring_send_cpu.py`` (issue 13). Only what sending needs:
``io_uring_setup`` (syscall 425) with or without ``IORING_SETUP_SQPOLL``, one ``mmap``
of the SQ and CQ rings (``IORING_FEAT_SINGLE_MMAP``) and one of the SQE array,
``IORING_OP_SEND`` entries and the completions read back from the CQ ring;
``io_uring_enter`` (syscall 426) only to submit without SQPOLL, to wake a sleeping SQ
thread, to wait for room in the SQ ring and to flush an overflowed CQ.

Memory ordering -- what this relies on (x86-64 only; ``Ring`` refuses other machines):

- The ring indices are aligned 32-bit words in shared memory, written and read here
  through a ``memoryview`` cast to ``'I'``: one plain ``mov`` each, atomic on x86-64.
- x86-64 is TSO: stores are seen in program order and loads are not reordered with
  older loads nor stores with older loads. So the SQEs written before the SQ tail store
  are visible to the kernel before the new tail (the release liburing's
  ``io_uring_smp_store_release`` gives), CQEs read after the CQ tail load are at least
  as new as that tail (acquire), and the CQ head store comes after those reads. The
  CPython interpreter executes these stores and loads in program order (each is a
  separate C call; nothing reorders across them).
- The one reordering TSO allows -- a later load passing an earlier store -- matters
  once: after storing the SQ tail, the SQ ring's flags must be read only after the
  store is visible, or the SQ thread may go to sleep (setting ``NEED_WAKEUP``) without
  seeing the new tail while we read the old flags and skip the wake-up (liburing puts
  ``io_uring_smp_mb()`` there). The tail is therefore stored with libatomic's
  ``__atomic_exchange_4`` (a ``lock xchg``: a full barrier), once per submitted batch.
- ``IORING_SETUP_SINGLE_ISSUER``: one thread writes SQEs; nothing here is thread-safe.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import mmap
import os
import platform
import struct
from dataclasses import dataclass

SYS_IO_URING_SETUP = 425
SYS_IO_URING_ENTER = 426
SYS_IO_URING_REGISTER = 427

IORING_REGISTER_EVENTFD = 4
IORING_REGISTER_IOWQ_MAX_WORKERS = 19

IORING_SETUP_SQPOLL = 1 << 1
IORING_SETUP_SQ_AFF = 1 << 2
IORING_SETUP_CQSIZE = 1 << 3
IORING_SETUP_COOP_TASKRUN = 1 << 8
IORING_SETUP_SINGLE_ISSUER = 1 << 12

IORING_FEAT_SINGLE_MMAP = 1 << 0
IORING_FEAT_NODROP = 1 << 1

IORING_ENTER_GETEVENTS = 1 << 0
IORING_ENTER_SQ_WAKEUP = 1 << 1
IORING_ENTER_SQ_WAIT = 1 << 2

IORING_SQ_NEED_WAKEUP = 1 << 0
IORING_SQ_CQ_OVERFLOW = 1 << 1

IORING_OFF_SQ_RING = 0
IORING_OFF_SQES = 0x10000000

IOSQE_ASYNC = 1 << 4  # always punt the request to an io-wq worker thread

IORING_OP_SEND = 26
MSG_NOSIGNAL = 0x4000

SQE_SIZE = 64
CQE_SIZE = 16
# struct io_uring_sqe, its first 40 bytes (the rest stays zero): opcode, flags, ioprio,
# fd, off, addr, len, msg_flags, user_data.
SQE_HEAD = struct.Struct("<BBHiQQIIQ")
CQE = struct.Struct("<QiI")  # user_data, res, flags
CQE_RESULT = struct.Struct("<Qi4x")  # user_data, res (flags skipped)
# struct io_uring_params: 10 u32 (sq_entries .. resv[3]), then io_sqring_offsets and
# io_cqring_offsets (8 u32 + one u64 each): 120 bytes.
PARAMS = struct.Struct("<10I8IQ8IQ")
assert SQE_HEAD.size == 40 and PARAMS.size == 120 and CQE.size == CQE_SIZE


def pack_send_sqe(fd: int, address: int, length: int, user_data: int, sqe_flags: int = 0) -> bytes:
    """The first 40 bytes of an ``IORING_OP_SEND`` SQE (MSG_NOSIGNAL, no MSG_DONTWAIT:
    a send the socket cannot take now is retried by the kernel when it is writable);
    ``sqe_flags`` such as ``IOSQE_ASYNC``."""
    return SQE_HEAD.pack(
        IORING_OP_SEND, sqe_flags, 0, fd, 0, address, length, MSG_NOSIGNAL, user_data
    )


@dataclass(frozen=True)
class RingLayout:
    """What ``io_uring_setup`` answered: entries, features and the rings' offsets."""

    sq_entries: int
    cq_entries: int
    features: int
    sq_head: int  # offsets into the ring mapping, the masks' and flags' included
    sq_tail: int
    sq_mask: int
    sq_flags: int
    sq_array: int
    cq_head: int
    cq_tail: int
    cq_mask: int
    cq_overflow: int
    cqes: int

    @classmethod
    def from_params(cls, raw: bytes) -> RingLayout:
        f = PARAMS.unpack(raw)
        # f[0:10] sq_entries, cq_entries, flags, sq_thread_cpu, sq_thread_idle, features,
        # wq_fd, resv x3; f[10:19] sq_off head, tail, ring_mask, ring_entries, flags,
        # dropped, array, resv1, user_addr; f[19:28] cq_off head, tail, ring_mask,
        # ring_entries, overflow, cqes, flags, resv1, user_addr.
        return cls(
            sq_entries=f[0], cq_entries=f[1], features=f[5],
            sq_head=f[10], sq_tail=f[11], sq_mask=f[12], sq_flags=f[14], sq_array=f[16],
            cq_head=f[19], cq_tail=f[20], cq_mask=f[21], cq_overflow=f[23], cqes=f[24],
        )  # fmt: skip


def setup_params(*, flags: int, cq_entries: int, sq_thread_cpu: int, sq_idle_ms: int) -> bytes:
    """The ``struct io_uring_params`` passed to ``io_uring_setup``."""
    fields = [0] * 28
    fields[1], fields[2], fields[3], fields[4] = cq_entries, flags, sq_thread_cpu, sq_idle_ms
    return PARAMS.pack(*fields)


class RingError(OSError):
    pass


class Ring:
    """One io_uring: ``prepare_send`` writes SQEs, ``submit`` publishes them (and wakes
    or enters the kernel), ``reap`` returns the completions as (user_data, res).
    ``sqe_flags`` go on every SQE (``IOSQE_ASYNC``: the kernel hands each send to its
    io-wq worker threads instead of trying it inline in ``io_uring_enter``)."""

    def __init__(
        self, sq_entries: int, cq_entries: int, *, sqpoll: bool, sq_idle_ms: int = 10,
        sq_cpu: int | None = None, sqe_flags: int = 0,
    ) -> None:  # fmt: skip
        if platform.machine() != "x86_64":
            raise RingError(0, "the memory-ordering assumptions hold on x86-64 only")
        self._libc = ctypes.CDLL(None, use_errno=True)
        self._libc.syscall.restype = ctypes.c_long
        # PyDLL: called with the GIL held (no release/re-acquire around a one-instruction call)
        atomic = ctypes.PyDLL(ctypes.util.find_library("atomic") or "libatomic.so.1")
        self._xchg = getattr(atomic, "__atomic_exchange_4")  # (no name mangling)
        self._xchg.argtypes = [ctypes.c_void_p, ctypes.c_uint32, ctypes.c_int]
        self._xchg.restype = ctypes.c_uint32
        self.sqpoll = sqpoll
        self.sqe_flags = sqe_flags
        flags = IORING_SETUP_CQSIZE | IORING_SETUP_SINGLE_ISSUER
        flags |= IORING_SETUP_SQPOLL if sqpoll else IORING_SETUP_COOP_TASKRUN
        if sqpoll and sq_cpu is not None:
            flags |= IORING_SETUP_SQ_AFF
        params = ctypes.create_string_buffer(
            setup_params(flags=flags, cq_entries=cq_entries, sq_thread_cpu=sq_cpu or 0,
                         sq_idle_ms=sq_idle_ms if sqpoll else 0), PARAMS.size)  # fmt: skip
        fd = self._libc.syscall(SYS_IO_URING_SETUP, ctypes.c_uint(sq_entries), params)
        if fd < 0:
            err = ctypes.get_errno()
            raise RingError(err, f"io_uring_setup(sqpoll={sqpoll}): {os.strerror(err)}")
        self.fd = int(fd)
        self.layout = layout = RingLayout.from_params(params.raw)
        if not layout.features & IORING_FEAT_SINGLE_MMAP:
            raise RingError(0, "kernel without IORING_FEAT_SINGLE_MMAP")
        size = max(
            layout.sq_array + 4 * layout.sq_entries, layout.cqes + CQE_SIZE * layout.cq_entries
        )
        prot, share = mmap.PROT_READ | mmap.PROT_WRITE, mmap.MAP_SHARED | mmap.MAP_POPULATE
        self._rings = mmap.mmap(self.fd, size, share, prot, offset=IORING_OFF_SQ_RING)
        self._sqes = mmap.mmap(
            self.fd, SQE_SIZE * layout.sq_entries, share, prot, offset=IORING_OFF_SQES
        )
        self._words = memoryview(self._rings).cast("I")
        for index in range(layout.sq_entries):  # the SQ array maps slot i to SQE i, once
            self._words[layout.sq_array // 4 + index] = index
        self.sq_mask = self._words[layout.sq_mask // 4]
        self.cq_mask = self._words[layout.cq_mask // 4]
        self._tail_ptr = ctypes.c_uint32.from_buffer(self._rings, layout.sq_tail)
        self._tail = self._words[layout.sq_tail // 4]
        self._published = self._tail
        self.wakeups = 0  # io_uring_enter calls to wake the SQ thread
        self.enters = 0  # io_uring_enter calls to submit (no SQPOLL)
        self.sq_full_waits = 0
        self.overflow_flushes = 0

    def room(self) -> int:
        """Free SQ slots (the kernel's head is read fresh)."""
        return self.layout.sq_entries - (self._tail - self._words[self.layout.sq_head // 4])

    def prepare_send(self, fd: int, address: int, length: int, user_data: int) -> None:
        """Write one SEND SQE; it reaches the kernel at the next ``submit``."""
        while self.room() <= 0:
            self.submit()
            if self.sqpoll:
                self._enter(0, 0, IORING_ENTER_SQ_WAIT)
            self.sq_full_waits += 1
        slot = self._tail & self.sq_mask
        SQE_HEAD.pack_into(
            self._sqes, slot * SQE_SIZE,
            IORING_OP_SEND, self.sqe_flags, 0, fd, 0, address, length, MSG_NOSIGNAL,
            user_data,
        )  # fmt: skip
        self._tail = (self._tail + 1) & 0xFFFFFFFF

    @property
    def prepared(self) -> int:
        """SQEs written and not submitted yet."""
        return (self._tail - self._published) & 0xFFFFFFFF

    def submit(self) -> None:
        """Publish the prepared SQEs: one tail store with a full barrier (see the module
        doc), then wake the SQ thread if it sleeps, or enter the kernel without SQPOLL."""
        count = (self._tail - self._published) & 0xFFFFFFFF
        if not count:
            return
        self._xchg(ctypes.addressof(self._tail_ptr), self._tail, 5)  # __ATOMIC_SEQ_CST
        self._published = self._tail
        if self.sqpoll:
            if self._words[self.layout.sq_flags // 4] & IORING_SQ_NEED_WAKEUP:
                self._enter(0, 0, IORING_ENTER_SQ_WAKEUP)
                self.wakeups += 1
        else:
            self._enter(count, 0, 0)
            self.enters += 1

    def reap(self, out: list[tuple[int, int]]) -> None:
        """Append every available completion to ``out`` as (user_data, res)."""
        layout, words = self.layout, self._words
        if words[layout.sq_flags // 4] & IORING_SQ_CQ_OVERFLOW:
            self._enter(0, 0, IORING_ENTER_GETEVENTS)  # flush the kernel's backlog (NODROP)
            self.overflow_flushes += 1
        head = words[layout.cq_head // 4]
        tail = words[layout.cq_tail // 4]  # acquire: loads are not reordered on x86-64
        count = (tail - head) & 0xFFFFFFFF
        base, rings = layout.cqes, self._rings
        while count:  # at most twice: up to the end of the ring, then from its start
            start = head & self.cq_mask
            run = min(count, self.cq_mask + 1 - start)
            offset = base + start * CQE_SIZE
            out.extend(CQE_RESULT.iter_unpack(rings[offset : offset + run * CQE_SIZE]))
            head = (head + run) & 0xFFFFFFFF
            count -= run
        words[layout.cq_head // 4] = head  # release: after the CQE loads, by TSO

    def run_task_work(self) -> None:
        """Without SQPOLL, sends the kernel retried complete in our task: let them."""
        if not self.sqpoll:
            self._enter(0, 0, IORING_ENTER_GETEVENTS)

    def max_workers(self, bounded: int, unbounded: int) -> tuple[int, int]:
        """Cap this task's io-wq workers (``IORING_REGISTER_IOWQ_MAX_WORKERS``; 0 leaves a
        cap as it is; sends to sockets go to the unbounded pool); the previous caps."""
        values = (ctypes.c_uint32 * 2)(bounded, unbounded)
        result = self._libc.syscall(
            SYS_IO_URING_REGISTER, self.fd, IORING_REGISTER_IOWQ_MAX_WORKERS, values, 2
        )
        if result < 0:
            err = ctypes.get_errno()
            raise RingError(err, f"IORING_REGISTER_IOWQ_MAX_WORKERS: {os.strerror(err)}")
        return values[0], values[1]

    def register_eventfd(self, eventfd: int) -> None:
        """Have the kernel signal ``eventfd`` whenever it posts a completion
        (``IORING_REGISTER_EVENTFD``): what an event loop waits for."""
        value = ctypes.c_int32(eventfd)
        result = self._libc.syscall(
            SYS_IO_URING_REGISTER, self.fd, IORING_REGISTER_EVENTFD, ctypes.byref(value), 1
        )
        if result < 0:
            err = ctypes.get_errno()
            raise RingError(err, f"IORING_REGISTER_EVENTFD: {os.strerror(err)}")

    def fdinfo(self) -> dict[str, str]:
        """The kernel's own account of the ring (``SqThreadCpu``, ``SqTotalTime`` ...)."""
        info = {}
        with open(f"/proc/self/fdinfo/{self.fd}") as lines:
            for line in lines:
                key, _colon, value = line.partition(":")
                if key.startswith("Sq") or key.startswith("Cq"):
                    info[key.strip()] = value.strip()
        return info

    def _enter(self, to_submit: int, min_complete: int, flags: int) -> int:
        result = self._libc.syscall(
            SYS_IO_URING_ENTER, self.fd, to_submit, min_complete, flags, None, 0
        )
        if result < 0:
            err = ctypes.get_errno()
            if err not in (4, 16):  # EINTR, EBUSY (CQ backlog): the caller reaps and retries
                raise RingError(err, f"io_uring_enter: {os.strerror(err)}")
        return int(result)

    def close(self) -> None:
        del self._tail_ptr
        self._words.release()
        self._rings.close()
        self._sqes.close()
        os.close(self.fd)
