"""The fields of one subject's messages, merged once for all its conflated subscriptions.

A conflated subscription emits, once a period, the latest message with the union of the
fields of the messages of that period (later values win), started again from a message
whose fields would take the union past ``MaxMessageSize`` (:mod:`migratory.model.conflation`).
Each subscription merged every message's fields into a dict of its own: a publish of
20,000 fields to a subject with 200 conflated subscribers was 4 million field merges on
the event loop, 2.6 s during which no client was served (docs/benchmarks.md, "Conflation
merged each field once per subscriber").

All the conflated subscriptions of a subject see the same messages, so their unions
differ only by where they start: the union since message ``s`` holds every field whose
latest value was set by message ``s`` or a later one, with that value. One
:class:`FieldTimeline` per subject keeps each field's latest value and the index of the
message that set it (a dict ordered by that index), and the size of the union of every
start a subscription holds (a Fenwick tree of differences over the starts, in increasing
order). A message costs O(its fields x log(starts)) once for the subject; a subscription
costs O(log(starts)) per message with fields (its size check), and the union it emits
O(its size) once per period -- the work to encode it anyway.

Only messages with fields take an index. Memory: the fields set since the oldest start
held (each start's union is bounded by MaxMessageSize, so those are too), plus dead
entries up to as many again before they are pruned; starts no subscription holds any
more are dropped once they are half of them. Pure: no clock, no I/O.
"""

from __future__ import annotations

from bisect import bisect_left, bisect_right
from collections.abc import Iterable
from dataclasses import replace

from migratory.model.message import Message, MessageType

__all__ = ["FieldTimeline"]

PRUNE_SLACK = 1024
"""Dead fields (set before every start held) or released starts kept before a clean-up."""


class FieldTimeline:
    """One subject's fields, their latest values, and the union sizes of the starts held."""

    __slots__ = (
        "_counts", "_emitted", "_extra", "_fields", "_held", "_here", "_here_size", "_latest",
        "_live",
        "_next", "_offset", "_prune_at", "_seen", "_starts", "_tree",
    )

    def __init__(self) -> None:
        # name -> (value, index of the message that set it, bytes of name and value),
        # ordered by index (a field set again is moved to the end)
        self._fields: dict[str, tuple[str, int, int]] = {}
        self._next = 0  # the index the next message with fields takes
        self._starts: list[int] = []  # the starts held (or released, count 0), increasing
        self._counts: list[int] = []  # subscriptions holding each start
        self._held = 0  # sum(_counts)
        self._live = 0  # starts held by at least one subscription
        self._tree: list[int] = [0] * 32  # Fenwick tree (1-based) of the starts' size differences
        self._offset = 0  # added to every start's size (a field new to all of them)
        self._latest: Message | None = None
        self._here = 0  # where a union starting at the latest message starts
        self._here_size = 0  # ... and its size (the latest message's fields)
        self._extra = 0  # the latest message's content and subject bytes
        self._prune_at = PRUNE_SLACK
        self._seen: dict[int, bool] = {}  # the size checks of the latest message, by start
        self._emitted: dict[int, Message] = {}  # what each start emitted since (emitted())

    def __repr__(self) -> str:
        return (f"<FieldTimeline {len(self._fields)} fields, {self._held} "
                f"subscriptions over {len(self._starts)} starts>")

    @property
    def latest(self) -> Message | None:
        """The latest message offered."""
        return self._latest

    @property
    def held(self) -> int:
        """Subscriptions holding a start (with a union pending)."""
        return self._held

    @property
    def field_count(self) -> int:
        """Fields kept (for tests: bounded by what the starts held need, and slack)."""
        return len(self._fields)

    def offer(self, message: Message) -> None:
        """Take ``message``, the subject's next one, for every subscription at once."""
        latest = self._latest
        if latest is not None and latest.subject != message.subject:
            raise ValueError(f"field timeline of {latest.subject!r} cannot take a message "
                             f"of {message.subject!r}")
        self._latest = message
        self._extra = len(message.content) + _text_size(message.subject)
        self._seen = {}
        self._emitted = {}
        fields = message.fields
        if not fields:
            self._here, self._here_size = self._next, 0
            return
        index = self._next
        self._next = index + 1
        known, starts, size_here = self._fields, self._starts, 0
        for name, value in fields.items():
            size = _text_size(name) + _text_size(value)
            size_here += size
            old = known.pop(name, None)
            self._offset += size  # every start's union has it now ...
            if old is not None and starts:
                # ... the starts at or before the old value's message had that one
                ranks = bisect_right(starts, old[1])
                if ranks:
                    self._add(0, -old[2])
                    self._add(ranks, old[2])
            known[name] = (value, index, size)
        self._here, self._here_size = index, size_here
        if len(known) > self._prune_at:
            self._prune()

    def hold(self) -> int:
        """A subscription's union starts at the latest message: its start."""
        start, starts = self._here, self._starts
        self._held += 1
        if starts and starts[-1] == start:
            self._live += not self._counts[-1]
            self._counts[-1] += 1
            return start
        if len(starts) + 1 >= len(self._tree):
            self._compact(1)
            starts = self._starts
        starts.append(start)
        self._counts.append(1)
        self._live += 1
        rank = len(starts) - 1
        self._add(rank, self._here_size - self._size_at(rank))  # (no later rank yet)
        return start

    def release(self, start: int) -> None:
        """A subscription no longer holds ``start`` (it emitted, or it is gone)."""
        rank = bisect_left(self._starts, start)
        self._counts[rank] -= 1
        self._held -= 1
        if self._counts[rank]:
            return
        self._live -= 1
        if not self._held:  # no union pending: only the latest message's fields may be
            self._clear()
        elif 2 * self._live + PRUNE_SLACK < len(self._starts):
            self._compact(0)

    def passes(self, start: int, max_size: int) -> bool:
        """Whether the union since ``start``, with the latest message (which must have
        fields), is larger than ``max_size``: the subscription starts again from it."""
        seen = self._seen.get(start)
        if seen is None:
            seen = self._seen[start] = self.union_size(start) + self._extra > max_size
        return seen

    def size_along(self, messages: Iterable[Message]) -> int:
        """A bound on what any union held now, or started along ``messages`` offered in
        turn, can reach with the content and subject of a message (what :meth:`passes`
        compares): the largest union held, every field of ``messages`` added to it, the
        largest content and subject among them
        (:func:`~migratory.model.conflation.offer_run_to`)."""
        oldest = next((rank for rank, count in enumerate(self._counts) if count), None)
        size = 0 if oldest is None else self._size_at(oldest)
        extra = 0
        for message in messages:
            extra = max(extra, len(message.content) + _text_size(message.subject))
            for name, value in message.fields.items():
                size += _text_size(name) + _text_size(value)
        return size + extra

    def union_size(self, start: int) -> int:
        """The bytes of the names and values of the union since ``start`` (held)."""
        return self._size_at(bisect_left(self._starts, start))

    @property
    def latest_has_fields(self) -> bool:
        latest = self._latest
        return latest is not None and bool(latest.fields)

    def emitted(self, start: int) -> Message:
        """The latest message with the union since ``start``, type UPDATE: one object for
        every subscription emitting that union before the next message or
        :meth:`forget_emitted` (the hub encodes it once for them)."""
        message = self._emitted.get(start)
        if message is None:
            latest = self._latest
            assert latest is not None
            message = self._emitted[start] = replace(
                latest, fields=self.union(start), type=MessageType.UPDATE)
        return message

    def idle(self) -> None:
        """No subscription has a union pending (the last one emitted): hold neither the
        latest message nor fields until the next one comes."""
        if not self._held:
            self._latest = None
            self._fields = {}
            self._emitted = {}

    def forget_emitted(self) -> None:
        """Let the messages :meth:`emitted` made go (the hub's tick is over)."""
        self._emitted = {}

    def union(self, start: int) -> dict[str, str]:
        """The fields set since ``start``, each with its latest value."""
        newest: list[tuple[str, str]] = []
        for name, (value, index, _) in reversed(self._fields.items()):
            if index < start:
                break
            newest.append((name, value))
        newest.reverse()
        return dict(newest)

    # --- the Fenwick tree of differences: a start's size is its prefix sum + offset ---

    def _add(self, rank: int, delta: int) -> None:
        tree = self._tree
        position, end = rank + 1, len(tree)
        while position < end:
            tree[position] += delta
            position += position & -position

    def _size_at(self, rank: int) -> int:
        tree, position, total = self._tree, rank + 1, self._offset
        while position > 0:
            total += tree[position]
            position -= position & -position
        return total

    def _compact(self, more: int) -> None:
        """Rebuild the tree over the starts held (released ones dropped), with room for
        ``more`` starts besides."""
        kept = [(s, c, self._size_at(r))
                for r, (s, c) in enumerate(zip(self._starts, self._counts, strict=True)) if c]
        self._starts = [s for s, _, _ in kept]
        self._counts = [c for _, c, _ in kept]
        self._tree = [0] * (2 * (len(kept) + more) + 16)
        self._offset = 0
        previous = 0
        for rank, (_, _, size) in enumerate(kept):
            self._add(rank, size - previous)
            previous = size

    def _clear(self) -> None:
        """Nobody holds a start: keep the latest message's fields only (a subscription
        that starts again from it in this same message needs them)."""
        newest: list[tuple[str, tuple[str, int, int]]] = []
        here = self._here
        for name, entry in reversed(self._fields.items()):
            if entry[1] < here:
                break
            newest.append((name, entry))
        newest.reverse()
        self._fields = dict(newest)
        self._starts, self._counts, self._tree, self._offset = [], [], [0] * 32, 0
        self._prune_at = 2 * len(newest) + PRUNE_SLACK

    def _prune(self) -> None:
        """Drop the fields set before every start held: no union has them."""
        oldest = next((s for s, c in zip(self._starts, self._counts, strict=True) if c),
                      self._here)
        self._fields = {n: e for n, e in self._fields.items() if e[1] >= oldest}
        self._prune_at = 2 * len(self._fields) + PRUNE_SLACK


def _text_size(text: str) -> int:
    return len(text) if text.isascii() else len(text.encode("utf-8", "surrogatepass"))
