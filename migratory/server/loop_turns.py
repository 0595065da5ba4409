"""The work the server's event loop does in one turn, over every connection, bounded.

trio runs, in one turn of its loop, every task that was ready when the turn began: each
connection with bytes waiting did its share of work (at most ``OPERATIONS_PER_TURN``,
connection.py) -- all of them before the loop looked at anything else. A herd of 2,000
clients resuming 10 subjects each from their own positions made one turn of 79 s
(docs/benchmarks.md, "A herd of resumes from different positions"): no other client,
no ``/readyz``, no batch tick meanwhile.

:class:`TurnBudget` (no I/O) counts the work of the current turn against
:data:`TURN_UNITS`; a connection finding the turn's budget spent waits in a fair queue
and is let in at the start of a later turn, in the order it came. Connections with new
bytes from their socket (``fresh``) are let in before those coming back for more of an
earlier read, so a newcomer's ping, publish or ``/readyz`` waits a few turns, not the
herd's whole catch-up; one coming back is let in each turn whatever the newcomers. A
connection let in has its step reserved in that turn -- :data:`FRESH_STEP` operations
for one with new bytes (a herd's newcomers go through quickly, then come back for the
rest), ``step`` for one coming back -- does at most that much, and pays what it did
when done. :class:`TurnGate` is its trio side: a trio instrument whose
``after_io_wait`` (once per turn, before the turn's tasks run) starts a turn and wakes
the connections let in, and a task that keeps the loop turning while some wait (else,
every task asleep, the loop would sleep until its next timer: ~5 ms lost per turn).
"""

from __future__ import annotations

from collections import deque
from typing import Generic, TypeVar

import trio

__all__ = ["TURN_UNITS", "TurnBudget", "TurnGate"]

TURN_UNITS = 256
"""Operations (as connections count them: an operation, or ~16 recovered messages) the
loop does per turn over every connection, about 5-15 ms; a turn may pass it by at most
a step and what the last operation of a step counts."""

FRESH_STEP = 2
"""Operations a connection let in from the queue with new bytes does in its step: a
herd's newcomers each decode their request and come back for the rest, so a bystander's
publish behind 5,000 of them waits ~40 turns (with 8: ~160 turns, 6-9 s on a busy
machine; docs/benchmarks.md)."""

W = TypeVar("W")


class TurnBudget(Generic[W]):
    """The work of the current turn and the connections waiting for a later one."""

    __slots__ = ("_continuing", "_fresh", "done", "fresh_step", "largest", "per_turn",
                 "spent", "step", "turns", "waited")

    def __init__(self, per_turn: int, step: int, fresh_step: int = FRESH_STEP) -> None:
        self.per_turn = per_turn
        self.step = step  # what a connection let in from the queue has reserved
        self.fresh_step = fresh_step  # the same, one with new bytes
        self.turns = 0
        self.spent = 0  # this turn's work, with the reservations of those let in
        self.done = 0  # this turn's work done (what tests count)
        self.largest = 0  # the most work done in one turn so far
        self.waited = 0  # steps that waited for a later turn
        self._fresh: deque[W] = deque()
        self._continuing: deque[W] = deque()

    @property
    def queued(self) -> int:
        return len(self._fresh) + len(self._continuing)

    def new_turn(self) -> list[W]:
        """A turn begins: the waiting let in now, in order (one coming back first)."""
        self.turns += 1
        self.spent = self.done = 0
        admitted: list[W] = []
        if self._continuing:
            admitted.append(self._continuing.popleft())
            self.spent += self.step
        while self.spent < self.per_turn and self._fresh:
            admitted.append(self._fresh.popleft())
            self.spent += self.fresh_step
        while self.spent < self.per_turn and self._continuing:
            admitted.append(self._continuing.popleft())
            self.spent += self.step
        return admitted

    def enter(self) -> bool:
        """May a connection with fresh bytes work now, in this turn? (Room is left, and
        nobody is waiting before it.) It pays with :meth:`paid`, reserved 0."""
        return self.spent < self.per_turn and not self._fresh

    def wait(self, waiter: W, *, fresh: bool) -> None:
        """``waiter`` waits for a later turn (:meth:`new_turn` lets it in)."""
        (self._fresh if fresh else self._continuing).append(waiter)
        self.waited += 1

    def leave(self, waiter: W) -> None:
        """``waiter`` no longer waits (its connection closed)."""
        for queue in (self._fresh, self._continuing):
            if waiter in queue:
                queue.remove(waiter)

    def paid(self, units: int, reserved: int) -> None:
        """A step of a connection did ``units`` of work, ``reserved`` of it in advance."""
        self.spent += units - reserved
        self.done += units
        if self.done > self.largest:
            self.largest = self.done

    def statistics(self) -> dict[str, int]:
        return {"per_turn": self.per_turn, "turns": self.turns, "largest_turn": self.largest,
                "waited": self.waited, "waiting": self.queued}


class TurnGate(trio.abc.Instrument):
    """The trio side of a :class:`TurnBudget`: connections wait here for their turn."""

    def __init__(self, per_turn: int, step: int) -> None:
        self.budget: TurnBudget[trio.Event] = TurnBudget(per_turn, step)
        self._root: object = None  # the run it is an instrument of
        self._spin: trio.Event | None = None  # set: the spinning task has waiters to serve

    def after_io_wait(self, timeout: float) -> None:
        for event in self.budget.new_turn():
            event.set()

    async def turn(self, *, fresh: bool) -> int:
        """Until this connection may work in the current turn; the work reserved for it,
        at most what it may do in this step (0: it did not wait, a whole step). Pay it
        back with :meth:`paid`. ``fresh``: new bytes from its socket, else more of an
        earlier read (that one always waits for a later turn)."""
        root = trio.lowlevel.current_root_task()
        if root is not self._root:  # installed in the run serving (a test may run many)
            trio.lowlevel.add_instrument(self)
            self._spin = trio.Event()
            trio.lowlevel.spawn_system_task(self._keep_turning, self._spin)
            self._root = root
        budget = self.budget
        if fresh and budget.enter():
            return 0
        event = trio.Event()
        budget.wait(event, fresh=fresh)
        assert self._spin is not None
        self._spin.set()
        reserved = budget.fresh_step if fresh else budget.step
        try:
            await event.wait()
        except BaseException:
            if event.is_set():
                budget.paid(0, reserved)
            else:
                budget.leave(event)
            raise
        return reserved

    def paid(self, units: int, reserved: int) -> None:
        """A step did ``units`` of work (at least one counted: reading is work too)."""
        self.budget.paid(max(1, units), reserved)

    async def _keep_turning(self, spin: trio.Event) -> None:
        """A task ready every turn while connections wait, so that the loop goes on to
        the next turn at once."""
        budget = self.budget
        while True:
            await spin.wait()
            while budget.queued:
                await trio.lowlevel.cancel_shielded_checkpoint()
            if self._spin is not spin:  # (another run's)
                return
            spin = self._spin = trio.Event()
