"""``SendPath = io_uring``: the clients' writes leave the event loop's thread.

With the default ``SendPath = socket`` the loop thread writes every batch with a
non-blocking ``send``, and the kernel's whole loopback/TCP path for it (~7-10 us a
write, a third to a half of the server's CPU at 40,000 messages/s over 10,000 subjects)
runs on that thread. Here each write becomes an ``IORING_OP_SEND`` flagged
``IOSQE_ASYNC``: the kernel's io-wq worker threads do the send on another core while the
loop goes on (docs/benchmarks.md, "io_uring without a polling core"). Nothing polls:
the workers sleep when there is nothing to send.

The rules that keep a connection's bytes whole and in order:

- at most one send in flight per connection (its ``writing`` flag holds the others
  back, as a drain task's does), so the fd names the send (``user_data``);
- the batch (a ``bytes`` object, immutable) is referenced until its completion; the
  kernel reads it in place (its data sits ``BYTES_DATA_OFFSET`` after ``id()``,
  checked when the writer opens);
- a connection closed with a send in flight keeps its fd open until the completion,
  so no new connection can reuse the fd number under that send;
- the owner is told every completion: bytes written (a short one puts the rest back
  in front of its outbox), or ``-errno``.

SQEs written while the server writes many connections at once (a batch tick, the
writes after one client's input) are submitted together, with one ``io_uring_enter``
(:meth:`hold` / :meth:`release`). Each enter costs the loop thread the kernel's hand-over
of its SQEs to the workers (~11 % of the thread at 40,000 writes/s, entering after
every input), so while the server writes more than ``BUSY_WRITES_PER_SECOND`` the
writer enters at most once per ``submit_every`` (``SUBMIT_EVERY``: a write waits at most
that long); below that rate every write goes at once. Completions come back through an
eventfd the writer's task waits on, reaped at most every ``REAP_EVERY``.
"""

from __future__ import annotations

import contextlib
import ctypes
import logging
import os
from typing import Protocol

import trio

from migratory.server.uring_ring import IOSQE_ASYNC, Ring, RingError

log = logging.getLogger("migratory.uring")

BYTES_DATA_OFFSET = 32
"""Where a ``bytes`` object's data starts after its address (CPython 3.11, 64-bit:
``ob_refcnt``, ``ob_type``, ``ob_size``, ``ob_shash``); checked by :meth:`UringWriter.open`."""
SUBMIT_EVERY = 0.010
"""Seconds between two ``io_uring_enter`` of the server's writer under load."""
BUSY_WRITES_PER_SECOND = 30_000
"""Writes per second (over ``RATE_WINDOW``) from which the writer enters the kernel only
every ``SUBMIT_EVERY``; below, every write or batch of writes is submitted at once."""
RATE_WINDOW = 0.1
REAP_EVERY = 0.002
"""Seconds between two reaps of the server's writer: completions wake the loop at most
that often, not once per scheduler pass (a connection's next write waits for the
completion of its last, so this delays only a client written to again meanwhile)."""
SQ_ENTRIES = 4096
CQ_ENTRIES = 65536  # one send in flight per connection; the kernel keeps any overflow (NODROP)


def open_send_path(send_path: str) -> UringWriter | None:
    """The writer for ``SendPath`` (None: ``send()``); where io_uring cannot be had, a
    warning says why and the server writes with ``send()``."""
    if send_path != "io_uring":
        return None
    try:
        writer = UringWriter.open(submit_every=SUBMIT_EVERY, reap_every=REAP_EVERY)
    except UringUnavailable as exc:
        log.warning("SendPath = io_uring is not available here (%s): writing with send()", exc)
        return None
    log.info("writing to clients through io_uring (SendPath = io_uring; TLS clients with send())")
    return writer


class UringUnavailable(Exception):
    """io_uring cannot be used here (an old kernel, a seccomp profile, another CPU...)."""


class SendOwner(Protocol):
    def sent(self, batch: bytes, result: int) -> None:
        """The send of ``batch`` completed: bytes written, or ``-errno``."""


def _bytes_data_offset_holds() -> bool:
    probe = b"migratory io_uring probe"
    return ctypes.string_at(id(probe) + BYTES_DATA_OFFSET, len(probe)) == probe


class UringWriter:
    __slots__ = (
        "_busy", "_completions", "_eventfd", "_flights", "_reaped_at", "_ring",
        "_submitted_at", "_wait", "_window_at", "_window_sends", "enters", "holding",
        "reap_every", "reaps", "sends", "submit_every",
    )

    def __init__(
        self, ring: Ring, eventfd: int, *, submit_every: float = 0.0, reap_every: float = 0.0
    ) -> None:
        """``submit_every`` (s): enter the kernel at most that often (0: at every write or
        release; else the run task submits what waits, so it needs trio); ``reap_every``
        (s): the run task reaps at most that often."""
        self._ring = ring
        self._eventfd = eventfd
        self.submit_every = submit_every
        self.reap_every = reap_every
        self._reaped_at = float("-inf")
        self.reaps = 0
        self._submitted_at = float("-inf")
        self._busy = False  # writing more than BUSY_WRITES_PER_SECOND: enters are spaced
        self._window_at = float("-inf")
        self._window_sends = 0
        self._wait: trio.CancelScope | None = None  # the run task's wait, deadline the due
        self.enters = 0
        self._flights: dict[int, tuple[SendOwner, bytes]] = {}  # fd -> (owner, batch)
        self._completions: list[tuple[int, int]] = []
        self.holding = 0  # > 0: SQEs wait for release() (many writes in a row)
        self.sends = 0

    @classmethod
    def open(cls, *, submit_every: float = 0.0, reap_every: float = 0.0) -> UringWriter:
        """A writer on a new ring; :class:`UringUnavailable` says why there is none."""
        if not _bytes_data_offset_holds():
            raise UringUnavailable("this Python's bytes layout is not the one expected")
        try:
            ring = Ring(SQ_ENTRIES, CQ_ENTRIES, sqpoll=False, sqe_flags=IOSQE_ASYNC)
        except (RingError, OSError) as exc:  # ENOSYS, EPERM (seccomp), io_uring_disabled
            raise UringUnavailable(str(exc)) from exc
        eventfd = os.eventfd(0, os.EFD_NONBLOCK | os.EFD_CLOEXEC)
        try:
            ring.register_eventfd(eventfd)
        except RingError as exc:
            ring.close()
            os.close(eventfd)
            raise UringUnavailable(str(exc)) from exc
        return cls(ring, eventfd, submit_every=submit_every, reap_every=reap_every)

    @property
    def in_flight(self) -> int:
        return len(self._flights)

    def send(self, fd: int, batch: bytes, owner: SendOwner) -> None:
        """Send ``batch`` on ``fd``; ``owner.sent`` is called once it completed. The caller
        keeps any other write of ``fd`` back until then."""
        if fd in self._flights:
            raise RuntimeError(f"a second send in flight on fd {fd}")
        self._flights[fd] = (owner, batch)
        self._ring.prepare_send(fd, id(batch) + BYTES_DATA_OFFSET, len(batch), fd)
        self.sends += 1
        if not self.holding:
            self._submit()

    def hold(self) -> None:
        self.holding += 1

    def release(self) -> None:
        self.holding -= 1
        if not self.holding:
            self._submit()

    def _submit(self) -> None:
        """Enter the kernel now; or, while the server writes more than
        ``BUSY_WRITES_PER_SECOND`` and within ``submit_every`` of the last enter, have the
        run task do it when that is up."""
        if not self._ring.prepared:
            return
        every = self.submit_every
        if every:
            now = trio.current_time()
            elapsed = now - self._window_at
            if elapsed >= RATE_WINDOW:
                self._busy = (self.sends - self._window_sends) / elapsed >= BUSY_WRITES_PER_SECOND
                self._window_at, self._window_sends = now, self.sends
            due = self._submitted_at + every
            if self._busy and now < due:
                if self._wait is not None and self._wait.deadline > due:
                    self._wait.deadline = due
                return
            self._submitted_at = now
        self._ring.submit()
        self.enters += 1

    def reap(self) -> int:
        """Hand every completion to its owner; how many there were."""
        completions = self._completions
        completions.clear()
        self._ring.reap(completions)
        if not completions:
            return 0
        self.holding += 1  # what the owners write next goes in one submission
        try:
            for fd, result in completions:
                owner, batch = self._flights.pop(fd)
                try:
                    owner.sent(batch, result)
                except Exception:  # one connection's failure ends that connection only
                    log.exception("a send's completion failed (fd %d, result %d)", fd, result)
        finally:
            self.release()
        return len(completions)

    async def run(self) -> None:
        """Wait for completions and hand them over, for as long as the server runs."""
        ring = self._ring
        try:
            while True:
                resume = self._reaped_at + self.reap_every
                due = self._submitted_at + self.submit_every if ring.prepared else float("inf")
                with trio.CancelScope(deadline=min(resume, due)) as self._wait:
                    if trio.current_time() < resume:
                        await trio.sleep_forever()  # a pause between reaps
                    else:
                        await trio.lowlevel.wait_readable(self._eventfd)
                self._wait = None
                now = trio.current_time()
                if ring.prepared and now >= self._submitted_at + self.submit_every:
                    self._submit()
                if now >= resume:
                    with contextlib.suppress(BlockingIOError):
                        os.eventfd_read(self._eventfd)
                    self._reaped_at = now
                    self.reaps += 1
                    self.reap()
        finally:
            self.close()

    def close(self) -> None:
        if self._eventfd < 0:
            return
        with contextlib.suppress(RuntimeError):  # RuntimeError: not in a trio run
            trio.lowlevel.notify_closing(self._eventfd)
        os.close(self._eventfd)
        self._eventfd = -1
        self._ring.close()
