"""The supervisor's watchdog of its workers' heartbeats (``kill_if_hung`` in
cluster/workers.py), on trio's mocked clock: no process, no wall time."""

from __future__ import annotations

import contextlib
import os
import threading

import trio
import trio.testing

from cluster.worker import BEAT_LINE, beat
from cluster.workers import BEAT_SECONDS, WorkerSlot, kill_if_hung

HANG = 10


def watch(
    *, beats_until: float | None, stall_at: float | None = None, hang: int = HANG
) -> float | None:
    """When (mock seconds) the watchdog killed a worker that beats every BEAT_SECONDS
    until ``beats_until`` (None: for ever), or None if it had not within 120 s.
    ``stall_at``: then the whole supervisor is held up for 60 s (the clock jumps: no
    task of it runs meanwhile, its workers' beats wait in the pipes), and the watchdog
    takes its turn before the relay reads them (the order is trio's to choose)."""
    clock = trio.testing.MockClock(autojump_threshold=0)
    slot = WorkerSlot(1)
    killed: list[float] = []

    async def beat() -> None:
        stall = stall_at
        while beats_until is None or trio.current_time() < beats_until:
            if stall is not None and trio.current_time() >= stall:
                clock.jump(60)  # the beats that waited are read after the watchdog's turn
                stall = None
                await trio.sleep(BEAT_SECONDS)
            slot.beats += 1
            await trio.sleep(BEAT_SECONDS)
        await trio.sleep_forever()

    async def main() -> None:
        with trio.move_on_after(120):
            async with trio.open_nursery() as nursery:
                nursery.start_soon(beat)

                def kill() -> None:
                    killed.append(trio.current_time())
                    nursery.cancel_scope.cancel()

                await kill_if_hung(slot, hang=hang, kill=kill)
                await trio.sleep_forever()  # (hang = 0: it returned at once)

    trio.run(main, clock=clock)
    return killed[0] if killed else None


def test_a_worker_whose_beats_stop_is_killed_once_silent_for_hang_seconds() -> None:
    killed = watch(beats_until=5)
    assert killed is not None
    assert 5 + HANG - BEAT_SECONDS <= killed <= 5 + HANG + BEAT_SECONDS


def test_a_worker_that_beats_is_not_killed() -> None:
    assert watch(beats_until=None) is None


def test_a_worker_that_never_beat_is_still_starting_not_hung() -> None:
    assert watch(beats_until=0) is None


def test_hang_time_0_watches_nothing() -> None:
    assert watch(beats_until=5, hang=0) is None


def test_a_supervisor_held_up_itself_does_not_take_its_workers_for_hung() -> None:
    """60 s without a turn of the supervisor's loop (SIGSTOP, a stalled machine) is one
    turn of the watchdog, after which it reads the beats that waited. Timed by the
    clock instead (silent since the last beat read), it killed the worker at once
    (planted: 'assert 65.0 is None')."""
    assert watch(beats_until=None, stall_at=5.0) is None



def test_a_beat_on_a_full_pipe_is_skipped_not_waited_for() -> None:
    """A worker's beat goes to its supervisor's pipe: one that reads nothing for long
    (held with SIGSTOP) fills it. The beat is skipped then; written anyway, it waited
    in the worker's event loop -- the whole worker stopped (planted: '[] == [False]')."""
    read, write = os.pipe()
    os.set_blocking(write, False)
    with contextlib.suppress(BlockingIOError):
        for _ in range(1000):  # (a pipe holds 64 KiB by default)
            os.write(write, b"x" * 4096)
    os.set_blocking(write, True)  # as a worker's stdout is
    out = os.fdopen(write, "w")
    skipped: list[bool] = []
    try:
        worker = threading.Thread(target=lambda: skipped.append(beat(out)), daemon=True)
        worker.start()
        worker.join(10)  # (a guard against a hang only)
        assert skipped == [False]
    finally:
        os.set_blocking(read, False)
        with contextlib.suppress(BlockingIOError):
            while os.read(read, 1 << 16):
                pass
    worker.join(10)
    assert beat(out) is True  # room again
    os.set_blocking(read, True)
    assert os.read(read, 100) == f"{BEAT_LINE}\n".encode()
    out.close()
    os.close(read)
