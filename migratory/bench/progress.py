"""A one-line progress bar on stderr for long runs; silent when stderr is not a terminal."""

from __future__ import annotations

import multiprocessing.connection as mpc
import sys
import time
from typing import TextIO


class Progress:
    """``[#####.....]  12.0/30 s  label`` redrawn in place, at most 4 times a second."""

    WIDTH = 30

    def __init__(
        self, total: float, label: str, *, stream: TextIO | None = None, enabled: bool | None = None
    ) -> None:
        self.total = max(total, 1e-9)
        self.label = label
        self.stream = stream if stream is not None else sys.stderr
        self.enabled = self.stream.isatty() if enabled is None else enabled
        self._drawn = 0.0
        self._t0 = time.monotonic()

    def line(self, done: float) -> str:
        share = min(max(done / self.total, 0.0), 1.0)
        filled = round(share * self.WIDTH)
        bar = "#" * filled + "." * (self.WIDTH - filled)
        return f"[{bar}] {done:5.1f}/{self.total:g} s  {self.label}"

    def update(self, done: float | None = None) -> None:
        if not self.enabled:
            return
        now = time.monotonic()
        if now - self._drawn < 0.25:
            return
        self._drawn = now
        self.stream.write("\r" + self.line(now - self._t0 if done is None else done))
        self.stream.flush()

    def close(self) -> None:
        if self.enabled:
            self.stream.write("\r" + " " * (self.WIDTH + 40 + len(self.label)) + "\r")
            self.stream.flush()


def wait_for_all(pipes: list[mpc.Connection], progress: Progress, timeout: float) -> None:
    """Redraw ``progress`` until every pipe has something to read (or ``timeout`` s)."""
    deadline = time.monotonic() + timeout
    waiting = list(pipes)
    try:
        while waiting and time.monotonic() < deadline:
            ready = mpc.wait(waiting, 0.25)
            waiting = [pipe for pipe in waiting if pipe not in ready]
            progress.update()
    finally:
        progress.close()
