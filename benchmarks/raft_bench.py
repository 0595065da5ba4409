"""What the benchmarks of a seed's Raft thread share (raft_dump_restart_ticks.py,
raft_leader_dump_election.py): waiting for a condition, and committing commands.

A command whose callback reports a failure (the leader changed with it in flight: its
outcome unknown) is submitted again, up to ``retries`` rounds; an older copy that did
commit makes the next one an overtaken request the coordinator drops (same origin and
ref), so no message is numbered twice. Every wait is bounded.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Sequence
from typing import Any

from pysyncobj import FAIL_REASON


def wait_for(predicate: Callable[[], Any], timeout: float, what: str,
             poll: float = 0.01) -> None:
    """Until ``predicate()`` holds; SystemExit naming ``what`` after ``timeout`` s."""
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise SystemExit(f"timed out: {what}")
        time.sleep(poll)


class _Round:
    """One round of submissions: the callbacks' outcomes."""

    def __init__(self, window: int) -> None:
        self.done = threading.Semaphore(0)
        self.window = threading.BoundedSemaphore(window)
        self.lock = threading.Lock()
        self.failed: list[Any] = []
        self.last = 0

    def callback(self, wire: Any) -> Callable[[Any, int], None]:
        def answered(result: Any, error: int) -> None:
            with self.lock:
                if error == FAIL_REASON.SUCCESS:
                    self.last = max(self.last, int(result))
                else:
                    self.failed.append(wire)
            self.window.release()
            self.done.release()
        return answered


def commit_all(consumer: Any, epoch: int, wires: Sequence[Any], *, timeout: float = 600.0,
               retries: int = 3, window: int = 64) -> dict[str, int]:
    """Submit every command of ``wires`` through ``consumer.commit_batch`` (``consumer``:
    or a function that says which, asked at each round: the current leader's), at most
    ``window`` unanswered at once, and wait for each callback; the failed ones again
    (``retries`` rounds at most). Returns the last clsn answered and how many commands
    were submitted again. (All at once through a seed that was no longer the leader, the
    forwards it could not send went past its hold's 32 MiB and were refused at once,
    cluster/raft_forward.py.)"""
    last, again = 0, 0
    pending = list(wires)
    deadline = time.monotonic() + timeout

    def left() -> float:
        return max(0.0, deadline - time.monotonic())

    for attempt in range(retries + 1):
        round_ = _Round(window)
        target = consumer() if callable(consumer) else consumer
        for wire in pending:
            if not round_.window.acquire(timeout=left()):
                raise SystemExit(f"Raft did not answer every command in {timeout:g} s")
            target.commit_batch(epoch, wire, callback=round_.callback(wire))
        for _ in pending:
            if not round_.done.acquire(timeout=left()):
                raise SystemExit(f"Raft did not answer every command in {timeout:g} s")
        last = max(last, round_.last)
        if not round_.failed:
            return {"clsn": last, "submitted_again": again}
        if attempt == retries:
            raise SystemExit(f"{len(round_.failed)} commands failed {retries + 1} times")
        again += len(round_.failed)
        pending = round_.failed
    raise AssertionError("unreachable")
