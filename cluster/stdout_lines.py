"""The Workers supervisor's stdout: its lines written off the event loop.

The supervisor prints ``listening URL`` once every worker is ready, then each worker's
``monitoring URL`` and ``worker I pid P`` lines, and ``worker I pid P`` again at every
restart. It printed them with ``print(..., flush=True)`` on its event loop, where the
sequencer -- the one source of positions for every worker -- also runs. A reader that
stops reading (a tool that reads the ``listening`` line and no more, a full pipe) made
that write block once the pipe held 64 KiB, and the whole server with it: no message
numbered, every worker shedding its clients after ~4 s (docs/workers.md).

:class:`StdoutLines` keeps the lines in order and one task writes them, each write in a
worker thread (``os.write`` on the descriptor: no lock of ``sys.stdout`` held by a
thread that may never return). A write that blocks holds up that task only; up to
:data:`MAX_WAITING` lines wait behind it, more are dropped and counted (a WARNING on
stderr once written again).
"""

from __future__ import annotations

import contextlib
import logging
import os
import select
import sys
from collections import deque

import trio

log = logging.getLogger("migratory.workers")

MAX_WAITING = 10_000
"""Lines that may wait for a reader; past them new lines are dropped (and counted)."""


def write_all(fd: int, data: bytes) -> None:
    """Every byte of ``data`` to ``fd`` (blocking; in a worker thread). A descriptor
    left non-blocking by another process sharing it is waited on."""
    view = memoryview(data)
    while view:
        try:
            written = os.write(fd, view)
        except BlockingIOError:
            select.select([], [fd], [], 1.0)
            continue
        view = view[written:]


class StdoutLines:
    """Lines for stdout, written in order by :meth:`run`; :meth:`say` never blocks."""

    def __init__(self, fd: int = 1, *, max_waiting: int = MAX_WAITING) -> None:
        self._fd = fd
        self._max_waiting = max_waiting
        self._waiting: deque[str] = deque()
        self._wake = trio.Event()
        self._writing = False
        self.dropped = 0
        """Lines dropped for want of a reader since the last were written."""
        self.written = 0

    def say(self, line: str) -> None:
        if len(self._waiting) >= self._max_waiting:
            self.dropped += 1
            return
        self._waiting.append(line)
        self._wake.set()

    @property
    def idle(self) -> bool:
        """Every line said is written (or failed: a reader that went away)."""
        return not self._waiting and not self._writing

    async def run(self) -> None:
        """Write the lines as they come, until cancelled."""
        with contextlib.suppress(OSError, ValueError):
            sys.stdout.flush()  # anything printed before goes first
        while True:
            await self._wake.wait()
            self._wake = trio.Event()
            while self._waiting:
                lines = list(self._waiting)
                self._waiting.clear()
                data = "".join(line + "\n" for line in lines).encode()
                self._writing = True
                try:
                    await trio.to_thread.run_sync(self._write, data, abandon_on_cancel=True)
                finally:
                    self._writing = False
                self.written += len(lines)
                if self.dropped:
                    log.warning("stdout: %d lines were dropped: nothing read them while "
                                "%d waited", self.dropped, self._max_waiting)
                    self.dropped = 0

    def _write(self, data: bytes) -> None:
        with contextlib.suppress(OSError):  # a reader that went away (EPIPE)
            write_all(self._fd, data)

    async def drained(self) -> None:
        """Until every line said is written; the caller bounds the wait (a reader that
        reads nothing never lets it end)."""
        while not self.idle:
            await trio.sleep(0.01)
