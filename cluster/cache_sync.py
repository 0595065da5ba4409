"""Cache sync: a member's subjects as they stand after a given batch, and taking them.

Pure. A member that cannot follow the committed stream batch by batch (it started
late, found a gap, or its upstream no longer has the batches it missed) copies a
peer's subjects: positions, snapshots and cached messages, as they stood after
committed batch ``clsn`` (:func:`export_sync` there, :func:`install_sync` here). The
same record also comes out of a Raft dump (:mod:`cluster.replicated_cache`).
A large sync is installed a slice at a time (:class:`SyncInstall`), the event loop
running between slices.

:class:`SubjectSync` is the one record type of a subject's synced state: the link
codec sends it, the replicated cache produces it, the hub takes its fields.
"""

from __future__ import annotations

import itertools
from collections import deque
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import Final

from migratory.model.cache import CachedRun
from migratory.model.message import Message
from migratory.model.position import Position
from migratory.server.hub import Hub

__all__ = [
    "SLICE_MESSAGES", "CacheSync", "SubjectSync", "SyncCapture", "SyncInstall", "capture_sync",
    "check_record", "check_sync", "export_sync", "install_sync",
]


@dataclass(frozen=True, slots=True)
class SubjectSync:
    """One numbered subject: its position, snapshot and cached messages."""

    subject: str
    epoch: int
    seq: int
    snapshot: Message | None
    cached: tuple[Message, ...]
    """Cached messages, oldest first, ending at ``seq``."""

    @property
    def position(self) -> Position:
        return Position(self.epoch, self.seq)


@dataclass(frozen=True, slots=True)
class CacheSync:
    """A member's numbered subjects as they stood after applying batch ``clsn``."""

    clsn: int
    subjects: Sequence[SubjectSync]
    """A tuple, or the records of a Raft dump built when read
    (:class:`~cluster.replicated_cache.DumpRecords`)."""


@dataclass(frozen=True, slots=True)
class SyncCapture:
    """A member's numbered subjects as they stood after batch ``clsn``, their cached
    messages not rebuilt yet: taking it is cheap, :meth:`subjects` does the work, a
    subject at a time (a cache sync written in parts, :mod:`cluster.link_sync`)."""

    clsn: int
    runs: tuple[tuple[str, Position, Message | None, CachedRun], ...]

    def subjects(self) -> Iterator[SubjectSync]:
        for subject, position, snapshot, run in self.runs:
            yield SubjectSync(subject, position.epoch, position.seq, snapshot, run.messages())

    def whole(self) -> CacheSync:
        return CacheSync(self.clsn, tuple(self.subjects()))


def capture_sync(hub: Hub, clsn: int) -> SyncCapture:
    """``hub``'s numbered subjects, labelled as standing after batch ``clsn``, to be
    rebuilt later (0.02 s for 680,000 cached messages where :func:`export_sync` takes
    ~1 s)."""
    return SyncCapture(clsn, tuple(hub.numbered()))


def export_sync(hub: Hub, clsn: int) -> CacheSync:
    """``hub``'s numbered subjects, labelled as standing after batch ``clsn``."""
    return capture_sync(hub, clsn).whole()


SLICE_MESSAGES: Final = 10_000
"""Cached messages (a subject counting a few more) a sliced install takes between two
turns of the event loop: ~15 ms of CPU on this machine (a whole sync of the default
CacheMemoryBudget, ~660,000 messages, installed at once stopped the loop ~1-2 s)."""


SUBJECT_WORK: Final = 8
"""Installing a subject new to the hub costs about as much as installing eight cached
messages (~13 us: 5,000 new subjects of one message each were a 64 ms slice)."""
RECORD_WORK: Final = 4
"""Reading and checking a subject's record costs about as much as four cached messages
(~5 us: a Raft dump's records are built when read, cluster/replicated_cache.py
DumpRecords; counted as one, a million subjects of one message each were 26-36 ms
slices)."""
UNNUMBER_WORK: Final = 4
"""Making a subject unnumbered costs about as much as installing four cached messages
(~4.4 us: 400,000 of them in slices of 10,000 subjects were 44 ms each)."""


def check_record(record: SubjectSync) -> None:
    """ValueError when ``record`` cannot be installed."""
    subject, cached = record.subject, record.cached
    if record.seq < 1:
        raise ValueError(f"record of {subject!r} has seq {record.seq} (must be >= 1)")
    if cached and cached[-1].seq != record.seq:
        raise ValueError(f"cached messages of {subject!r} do not end at seq {record.seq}")
    for previous, message in itertools.pairwise(cached):
        if message.seq != previous.seq + 1:
            raise ValueError(f"cached messages of {subject!r} are not consecutive")
    if any(m.subject != subject or m.epoch != record.epoch for m in cached):
        raise ValueError(f"cached messages of {subject!r} are not all of its epoch")


def check_sync(subjects: Iterable[SubjectSync]) -> None:
    """ValueError naming the first record that cannot be installed."""
    for record in subjects:
        check_record(record)


class SyncInstall:
    """Installing a sync into a hub a slice at a time (:meth:`step`), so that the event
    loop can run between slices.

    First every record is checked (ValueError, nothing changed); then the subjects the
    sync lacks become unnumbered; then each of the sync's subjects takes its state, whole
    within one slice: a client sees a subject as it was or as the sync has it, never
    half of it, and live subscribers get what each move jumped over (the hub's
    :meth:`~migratory.server.hub.Hub.reposition`). A subject this hub already has further
    in the same epoch keeps its own state (it is part of a batch after the sync's).

    Whoever drives it makes sure nothing else moves the hub's subjects meanwhile (the
    :class:`~cluster.replica.Replica` holds batches back until it is done).
    """

    __slots__ = ("_budget", "_hub", "_now", "_spent", "_work", "changed", "clsn", "done",
                 "slices", "subjects")

    def __init__(self, hub: Hub, subjects: Sequence[SubjectSync], clsn: int = 0) -> None:
        self._hub = hub
        self.subjects = subjects
        self.clsn = clsn
        self.changed = False
        """Whether a subject of the hub has been moved yet."""
        self.done = False
        self.slices = 0
        """Calls of :meth:`step` that did some work."""
        self._now = 0.0
        self._budget: int | None = None
        self._spent = 0
        self._work = self._slices()

    def step(self, now: float, budget: int | None = SLICE_MESSAGES) -> bool:
        """Install about ``budget`` cached messages' worth (None: all that is left);
        True once the whole sync is installed. ValueError, having changed nothing, for
        a record that does not fit (:func:`check_record`)."""
        if self.done:
            return True
        self._now, self._budget, self._spent = now, budget, 0
        self.slices += 1
        try:
            next(self._work)
        except StopIteration:
            self.done = True
        return self.done

    def _spend(self, work: int) -> bool:
        """Count ``work``; True when the slice is full (time to give the loop a turn)."""
        self._spent += work
        return self._budget is not None and self._spent >= self._budget

    def _slices(self) -> Iterator[None]:
        wanted: set[str] = set()
        # each record read once (a dump's are built when read) and let go once installed
        # (the hub keeps none of its messages: freed all at once, 660,000 were ~50 ms)
        records: deque[SubjectSync] = deque()
        for record in self.subjects:
            check_record(record)
            wanted.add(record.subject)
            records.append(record)
            if self._spend(RECORD_WORK + len(record.cached)):
                yield
        hub = self._hub
        # the names only (hub.numbered() copied every subject's cached run in one go)
        for subject in hub.subject_names():
            position = hub.position(subject)
            work = 1
            if subject not in wanted and position is not None and position.seq > 0:
                self.changed = True
                hub.reposition(subject, Position(hub.epoch, 0), None, (), self._now)
                work = UNNUMBER_WORK
            if self._spend(work):
                yield
        while records:
            record = records.popleft()
            ours = hub.position(record.subject)
            if ours is None or ours.epoch != record.epoch or ours.seq <= record.seq:
                self.changed = True
                hub.reposition(
                    record.subject, record.position, record.snapshot, record.cached, self._now
                )
            if self._spend(SUBJECT_WORK + len(record.cached)):
                yield


def install_sync(hub: Hub, subjects: Sequence[SubjectSync], now: float) -> None:
    """Make ``hub``'s subjects those of ``subjects``, all at once (:class:`SyncInstall`
    says how). Raises ValueError, changing nothing, for a record that does not fit (see
    :func:`check_sync`)."""
    SyncInstall(hub, subjects).step(now, budget=None)
