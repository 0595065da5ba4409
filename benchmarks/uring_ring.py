"""The benchmark's sender over :mod:`migratory.server.uring_ring` (the ring itself lives in
the server package, which uses it for ``SendPath = io_uring``): one send in flight per
connection, buffers referenced until their completion."""

from __future__ import annotations

import ctypes
import errno
import socket
import time
from collections import Counter
from typing import Any

from migratory.server.uring_ring import (  # noqa: F401 (re-exported for the benchmark and its test)
    IOSQE_ASYNC,
    Ring,
    RingError,
    RingLayout,
    pack_send_sqe,
    setup_params,
)


class UringSender:
    """SEND SQEs through a ``Ring``; one send in flight per connection, buffers referenced
    until their completion, short and ``-EAGAIN`` completions resubmitted (counted).
    ``submit_every`` (s): ``flush`` reaps every call but publishes the prepared SQEs only
    that long after the last publication (unless forced; ``idle`` always does), so an SQ
    thread with a shorter idle time sleeps in between."""

    def __init__(
        self, socks: list[socket.socket], ring: Ring, frame: bytes, *,
        name: str | None = None, submit_every: float = 0.0,
    ) -> None:  # fmt: skip
        self.name = name or ("sqpoll" if ring.sqpoll else "uring")
        self.submit_every = submit_every
        self.submitted_at = 0.0
        self.ring = ring
        self.fds = [sock.fileno() for sock in socks]
        self.frame_bytes = frame
        self.frame = ctypes.create_string_buffer(frame, len(frame))
        # per connection: (buffer kept alive, its address, bytes done, length) or None
        self.in_flight: list[tuple[Any, int, int, int] | None] = [None] * len(socks)
        self.flying = 0
        self.queued: dict[int, int] = {}  # frames due while a send was in flight
        self.completions: list[tuple[int, int]] = []
        self.counts: Counter[str] = Counter()

    def send(self, index: int) -> None:
        if self.in_flight[index] is not None:
            self.queued[index] = self.queued.get(index, 0) + 1
            self.counts["queued"] += 1
            return
        self._start(index, self.frame, ctypes.addressof(self.frame), 0, len(self.frame_bytes))

    def _start(self, index: int, buffer: Any, address: int, done: int, length: int) -> None:
        self.in_flight[index] = (buffer, address, done, length)
        self.flying += 1
        self.ring.prepare_send(self.fds[index], address + done, length - done, index)

    def reap(self) -> None:
        completions = self.completions
        completions.clear()
        self.ring.reap(completions)
        for index, res in completions:
            flight = self.in_flight[index]
            assert flight is not None, f"a completion for connection {index} with no send"
            self.in_flight[index] = None
            self.flying -= 1
            buffer, address, done, length = flight
            if res < 0:
                self.counts["eagain" if res == -errno.EAGAIN else f"errno {-res}"] += 1
                if res == -errno.EAGAIN:
                    self._start(index, buffer, address, done, length)
                continue
            if done + res < length:
                self.counts["partial"] += 1
                self._start(index, buffer, address, done + res, length)
            elif index in self.queued:
                frames = self.frame_bytes * self.queued.pop(index)
                joined = ctypes.create_string_buffer(frames, len(frames))
                self._start(index, joined, ctypes.addressof(joined), 0, len(frames))

    def flush(self, force: bool = False) -> None:
        self.reap()
        if self.submit_every and not force:
            now = time.monotonic()
            if now - self.submitted_at < self.submit_every:
                return
            self.submitted_at = now
        self.ring.submit()

    def idle(self) -> bool:
        self.ring.run_task_work()
        self.reap()
        self.ring.submit()
        return not self.flying and not self.queued

    def close(self) -> dict[str, Any]:
        info = self.ring.fdinfo()
        counts: dict[str, Any] = dict(self.counts)
        counts.update(wakeups=self.ring.wakeups, enters=self.ring.enters,
                      sq_full_waits=self.ring.sq_full_waits,
                      overflow_flushes=self.ring.overflow_flushes)  # fmt: skip
        counts.update({k: v for k, v in info.items() if k in ("SqTotalTime", "SqWorkTime")})
        self.ring.close()
        return counts
