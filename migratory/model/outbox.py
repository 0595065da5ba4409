"""The per-connection outbox that batches ready-to-write frames (sans-I/O)."""

__all__ = ["PEAK_WINDOW_SECONDS", "Outbox", "OutboxBudget", "SlowConsumer"]


class SlowConsumer(Exception):
    """A connection whose pending output would exceed its limit."""

    def __init__(self, pending_bytes: int, limit: int) -> None:
        super().__init__(pending_bytes, limit)
        self.pending_bytes = pending_bytes
        """Bytes that would be pending had the frame been accepted."""
        self.limit = limit

    def __str__(self) -> str:
        return f"slow consumer: {self.pending_bytes} bytes pending exceed the limit of {self.limit}"


class OutboxBudget:
    """Bytes all the outboxes of a server may hold together (``OutboxMemoryBudget``).

    Past it, an outbox that holds more than a sixteenth of its own limit takes no more:
    its client is the slow consumer; a client that keeps up (little pending) is never cut
    off because of the others. Without a budget the server keeps one of ``UNLIMITED``
    bytes: the total is still counted.

    It also keeps what ``GET /metrics`` reports without walking the connections: the
    bytes pending in all (``used``) and the largest single outbox seen (``largest``):
    an outbox is looked at when a batch is taken for a write and when a frame takes it
    to its batch space or past (a client whose socket is full), never per frame below
    that; the figure covers the current window and the one before
    (:meth:`next_window`, every :data:`PEAK_WINDOW_SECONDS` from the monitor)."""

    __slots__ = ("limit", "peak", "peak_before", "used")

    UNLIMITED = 1 << 62

    def __init__(self, limit: int) -> None:
        if limit <= 0:
            raise ValueError(f"limit must be > 0, got {limit}")
        self.limit = limit
        self.used = 0
        self.peak = 0  # the largest outbox seen in the current window
        self.peak_before = 0  # ... in the window before

    @property
    def largest(self) -> int:
        """The largest single outbox seen in this window and the one before."""
        return max(self.peak, self.peak_before)

    def next_window(self) -> None:
        self.peak_before, self.peak = self.peak, 0


PEAK_WINDOW_SECONDS = 10.0
"""How long one window of :attr:`OutboxBudget.largest` lasts (it covers 10-20 s)."""


class Outbox:
    """Frames waiting to be written to one connection, taken as one batch per write.

    ``enqueue`` says when ``batch_space`` bytes are pending (write now); the caller's
    timer handles the batch time. Pending bytes never exceed ``max_pending``.
    """

    __slots__ = (
        "_batch_space", "_budget", "_frames", "_held_at", "_held_bytes", "_max_pending",
        "_partial_head", "_pending_bytes", "_taken", "_taken_bytes", "batch_taken",
    )

    def __init__(
        self, *, batch_space: int, max_pending: int, budget: OutboxBudget | None = None
    ) -> None:
        if batch_space <= 0:
            raise ValueError(f"batch_space must be > 0, got {batch_space}")
        if max_pending <= 0:
            raise ValueError(f"max_pending must be > 0, got {max_pending}")
        self._batch_space = batch_space
        self._max_pending = max_pending
        # a list, not a deque: an empty deque holds a 64-slot block (760 bytes per idle
        # connection, measured with tracemalloc); an emptied list holds none. Frames are
        # only appended and taken all at once, so nothing pops from the front but a
        # requeued tail (the list is empty then) or a discard.
        self._frames: list[bytes] = []
        self._pending_bytes = 0
        self._taken: list[bytes] | None = None  # the frames of the last batch taken
        self._taken_bytes = 0  # its length
        self._partial_head = False  # the first frame is the unwritten rest of a frame
        self._budget = budget
        # a frame still being made (a history answer, in slices: :meth:`hold`) goes before
        # ``_frames[_held_at]``; nothing from there on is taken until it is in (``fill``)
        self._held_at: int | None = None
        self._held_bytes = 0  # what it counts for meanwhile: a bound of its size
        # a batch was taken to be written since the heartbeats last looked (heartbeats.py
        # clears it at each look)
        self.batch_taken = False

    def __bool__(self) -> bool:
        """Frames may be taken (some wait before a frame still being made)."""
        held_at = self._held_at
        return bool(self._frames) if held_at is None else held_at > 0

    def __len__(self) -> int:
        return len(self._frames)

    def __repr__(self) -> str:
        return f"<Outbox {len(self._frames)} frames, {self._pending_bytes} bytes>"

    @property
    def max_pending(self) -> int:
        """The most bytes that may wait (more make the client a slow consumer)."""
        return self._max_pending

    @property
    def batch_space(self) -> int:
        """Pending bytes that make a batch full (written at once)."""
        return self._batch_space

    @property
    def pending_bytes(self) -> int:
        """Bytes waiting to be written."""
        return self._pending_bytes

    def enqueue(self, frame: bytes) -> bool:
        """Queue ``frame``; True when ``batch_space`` bytes are now pending.

        Raises SlowConsumer, leaving the outbox unchanged, when the frame would take the
        pending bytes over ``max_pending``. Empty frames are ignored.
        """
        pending = self._pending_bytes + len(frame)
        if pending > self._max_pending:
            raise SlowConsumer(pending, self._max_pending)
        budget = self._budget
        if budget is not None:
            used = budget.used + len(frame)
            if used > budget.limit and pending > self._max_pending >> 4:
                raise SlowConsumer(used, budget.limit)
            budget.used = used
        if frame:
            self._frames.append(frame)
            self._pending_bytes = pending
        if pending < self._batch_space:
            return False
        if budget is not None and pending > budget.peak:  # (a batch full: not per frame)
            budget.peak = pending
        return True

    def enqueue_unbounded(self, frame: bytes) -> None:
        """Queue ``frame`` even past ``max_pending`` (a close frame, an HTTP response)."""
        if frame:
            self._frames.append(frame)
            self._pending_bytes += len(frame)
            if self._budget is not None:
                self._budget.used += len(frame)

    @property
    def holding(self) -> bool:
        """A frame is being made (:meth:`hold`): what comes after it waits."""
        return self._held_at is not None

    def hold(self, bound: int) -> None:
        """Make room for a frame of at most ``bound`` bytes that will be made over several
        turns of the loop (:meth:`fill`): frames queued meanwhile go after it, and it and
        they are counted as pending (it by ``bound``) against the limits, as if it were
        queued now. Raises SlowConsumer as :meth:`enqueue`, the outbox unchanged."""
        assert self._held_at is None, "one frame held at a time"
        self._check(self._pending_bytes + bound, bound)
        self._pending_bytes += bound
        self._held_at = len(self._frames)
        self._held_bytes = bound

    def fill(self, frame: bytes) -> bool:
        """The frame held by :meth:`hold`, made: queued where it was held (counted by its
        own size now); True when ``batch_space`` bytes may now be taken."""
        held_at = self._held_at
        assert held_at is not None, "fill without hold"
        self._frames.insert(held_at, frame)
        change = len(frame) - self._held_bytes
        self._pending_bytes += change
        if self._budget is not None:
            self._budget.used += change
        self._held_at = None
        self._held_bytes = 0
        return self._pending_bytes >= self._batch_space

    def _check(self, pending: int, size: int) -> None:
        """Whether ``size`` more bytes, ``pending`` then, may be queued (counted in the
        budget if so); SlowConsumer if not. (:meth:`enqueue` writes the same rule out:
        it runs once per delivery, where a call more is a cost of its own.)"""
        if pending > self._max_pending:
            raise SlowConsumer(pending, self._max_pending)
        budget = self._budget
        if budget is not None:
            used = budget.used + size
            if used > budget.limit and pending > self._max_pending >> 4:
                raise SlowConsumer(used, budget.limit)
            budget.used = used

    def take(self) -> bytes:
        """All pending frames as one bytes object (the frame itself if only one), emptied
        -- but for a frame being made (:meth:`hold`) and those after it."""
        if self._held_at is not None:
            return self._take_held()
        frames = self._frames
        if len(frames) == 1:
            batch = frames[0]
            frames.clear()
            self._taken = None
        else:
            batch = b"".join(frames)
            self._taken = frames  # where its frames end, should it be written in part
            self._frames = []
        budget = self._budget
        if budget is not None:
            budget.used -= self._pending_bytes
            if self._pending_bytes > budget.peak:
                budget.peak = self._pending_bytes
        self._pending_bytes = 0
        self._taken_bytes = len(batch)
        self._partial_head = False
        self.batch_taken = True
        return batch

    def _take_held(self) -> bytes:
        """``take`` with a frame being made: the frames before it."""
        held_at = self._held_at
        assert held_at is not None
        frames = self._frames
        taken = frames[:held_at]
        del frames[:held_at]
        self._held_at = 0
        batch = b"".join(taken)
        self._taken = taken
        size = len(batch)
        self._pending_bytes -= size
        if self._budget is not None:
            self._budget.used -= size
        self._taken_bytes = size
        self._partial_head = False
        self.batch_taken = True
        return batch

    def requeue_unsent(self, rest: bytes) -> None:
        """Put the unwritten tail of a taken batch back in front of the queue.

        Those bytes were already accepted, so this never raises SlowConsumer. The tail of
        the frame cut by the write is queued apart from the whole frames after it, so
        that ``discard(keep_first=True)`` keeps no more than that tail.
        """
        taken, self._taken = self._taken, None
        if not rest:
            return
        before = len(self._frames)
        self._requeue(taken, rest)
        if self._held_at is not None:
            self._held_at += len(self._frames) - before

    def _requeue(self, taken: list[bytes] | None, rest: bytes) -> None:
        self._pending_bytes += len(rest)
        if self._budget is not None:
            self._budget.used += len(rest)
        if taken is None:  # the batch was one frame
            self._frames.insert(0, rest)
            self._partial_head = len(rest) < self._taken_bytes
            return
        sent = sum(map(len, taken)) - len(rest)
        end = 0
        for frame in taken:
            end += len(frame)
            if end > sent:
                break
        cut = end - sent  # bytes left of the frame the write stopped in
        self._frames[0:0] = [rest[:cut], rest[cut:]] if cut < len(rest) else [rest]
        self._partial_head = cut < len(frame)

    def discard(self, *, keep_first: bool = False) -> int:
        """Drop pending frames (all, or all but the first); return the bytes dropped.

        ``keep_first`` keeps a partially written frame so that what follows it on the
        wire (a close frame) still lines up with frame boundaries; a first frame none of
        which was written is dropped like the others.
        """
        frames = self._frames
        self._held_at = None  # (a frame being made is dropped with them)
        self._held_bytes = 0
        first = frames.pop(0) if keep_first and self._partial_head and frames else None
        self._partial_head = first is not None
        dropped = self._pending_bytes - (len(first) if first is not None else 0)
        frames.clear()
        self._pending_bytes = 0
        if first is not None:
            frames.append(first)
            self._pending_bytes = len(first)
        if self._budget is not None:
            self._budget.used -= dropped
        return dropped
