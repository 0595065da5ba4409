"""A slow disk for the Raft simulation: a seed's ``fdatasync`` takes seconds.

Network-attached volumes stall (a noisy neighbour, a volume migration): an ``fdatasync``
that takes 0.3 ms takes 1-5 s for a while. Our Raft code syncs only through
:func:`cluster.raft_durability.sync_file` and
:func:`~cluster.raft_durability.sync_directory`, on the seed's Raft thread (a journal
write before a tick counts or answers it, a vote, a dump): a node whose disk is slow is
a node whose Raft thread stops there, mid-tick, while the others go on.

:class:`StalledDisk` stands in for both. A node is named by its files (``127.0.0.1_2.*`` in
the world's directory); while :meth:`StalledDisk.slow_for` holds for it, each of its syncs
*stalls* it: time runs on for the stall's seconds (:data:`STEP` at a time) with every
other node ticking and taking its messages, the stalled node's messages waiting in their
queues, as its socket's would; then the sync returns, to the rest of the node's tick, at
the later time. A stall inside a stall (two slow nodes) stops both; the outer one ends
no earlier than the inner (a real one could end first: this is the worse case for it).
"""

from __future__ import annotations

import os
import random
from collections.abc import Callable

from raft_sim import RaftWorld

STEP = 0.02  # seconds of the others' time per turn while a node is stalled


class StalledDisk:
    def __init__(self, world: RaftWorld, *, seconds: tuple[float, float] = (1.0, 3.0),
                 seed: int = 0) -> None:
        self.world = world
        self.seconds = seconds
        self._random = random.Random(seed)
        self.slow: dict[str, tuple[float, float]] = {}  # address -> [from, until) world time
        self.stalled: list[str] = []  # the nodes in a stall now (innermost last)
        self.stalls: dict[str, list[float]] = {}  # address -> the seconds of each stall
        self.syncs = 0
        self.stalled_on: list[str] = []  # the file or directory of each stall
        self._clients: tuple[float, Callable[[], None]] | None = None
        self._next_client_turn = 0.0

    def slow_for(self, addresses: list[str], seconds: float) -> None:
        """Each of ``addresses``'s syncs stalls it, from now for ``seconds``."""
        now = self.world.clock.now
        for address in addresses:
            self.slow[address] = (now, now + seconds)

    def _node(self, path: str) -> str | None:
        name = os.path.basename(path)
        for address in self.world.addresses:
            if name.startswith(address.replace(":", "_") + "."):
                return address
        return None

    def sync_file(self, fd: int) -> None:
        self.syncs += 1
        address = self._node(os.readlink(f"/proc/self/fd/{fd}"))
        if address is not None:
            self._stall(address, os.readlink(f"/proc/self/fd/{fd}"))

    def sync_directory(self, path: str) -> None:
        """A directory is every node's (one directory): the sync is the node's whose
        tick or message is being handled now."""
        self.syncs += 1
        if self._current is not None:
            self._stall(self._current, path)

    _current: str | None = None

    def _stall(self, address: str, on: str) -> None:
        window = self.slow.get(address)
        now = self.world.clock.now
        if window is None or not window[0] <= now < window[1] or address in self.stalled:
            return
        seconds = self._random.uniform(*self.seconds)
        self.stalls.setdefault(address, []).append(seconds)
        self.stalled_on.append(os.path.basename(on))
        self.stalled.append(address)
        receiving = self.world._receiving
        try:
            until = now + seconds
            while self.world.clock.now < until:
                self._advance(STEP)
                self.turn()
        finally:
            self.stalled.remove(address)
            self.world._receiving = receiving

    def clients(self, every: float, act: Callable[[], None]) -> None:
        """``act()`` each time ``every`` seconds passed, stalls included (clients keep
        publishing while a seed waits for its disk)."""
        self._clients = (every, act)
        self._next_client_turn = self.world.clock.now

    def _advance(self, seconds: float) -> None:
        self.world.clock.now += seconds
        if self._clients is not None and self.world.clock.now >= self._next_client_turn:
            every, act = self._clients
            self._next_client_turn = self.world.clock.now + every - 1e-9
            act()

    def turn(self) -> None:
        """Every node not stalled ticks; every message to one not stalled arrives."""
        for address in list(self.world.nodes):
            if address not in self.stalled and address in self.world.nodes:
                self._as(address, lambda a=address: self.world.tick(a))
        self.deliver()

    def deliver(self) -> int:
        """Every message in flight to a node not stalled arrives (once)."""
        world, done = self.world, 0
        for source, target in list(world.queues):
            if target not in self.stalled and target in world.nodes:
                done += self._as(target, lambda s=source, t=target: world.deliver(s, t, 10**9))
        return done

    def _as(self, address: str, work: Callable[[], int | None]) -> int:
        before, self._current = self._current, address
        try:
            return work() or 0
        finally:
            self._current = before

    def step(self, seconds: float) -> None:
        """:meth:`RaftWorld.step` with each node's syncs stalling it where it is slow."""
        self._advance(seconds)
        self.turn()
        for _ in range(1000):
            if not self.deliver():
                break
