"""The per-subject message cache that recovery and history read."""

from __future__ import annotations

from collections import deque
from collections.abc import Mapping, Sequence
from dataclasses import replace
from itertools import chain, islice
from typing import Any

from migratory.model.cache_budget import QUEUE_OVERHEAD, CacheBudget
from migratory.model.message import FIELD_TEXT_MEMORY, Message, MessageType, Qos, new_message
from migratory.model.untracked import untrack

__all__ = ["SubjectCache", "encoded_bound"]

FIELD_OVERHEAD = 6
"""CBOR header bytes of one field's name and value, at most, for fields under 64 KiB."""


def encoded_bound(message: Message) -> int:
    """:meth:`Message.size` plus the CBOR headers of its fields: what the cache counts."""
    return message.size() + FIELD_OVERHEAD * len(message.fields)


# An entry: (stored at, epoch, seq, subject, content, fields flat as name, value, name,
# value..., retained, qos, closure, type, encoded bound) -- a tuple of immutable atoms
# only. CPython's collector stops tracking such a tuple the first time it sees it, so a
# full cache costs the collector nothing. (Fields as pairs were a tuple of tuples that
# ``tuple()`` allocates before its items: the collector saw the outer one while the
# pairs were still tracked, kept it -- and the entry -- tracked, and they went on to the
# old generations tracked: ~1.4 more tracked objects per cached message with fields);
# storing ``Message`` objects (two tracked objects per message: the message and its
# ``(time, message)`` tuple) made every full collection walk every cached message, and
# with 100,000 cached messages a collection stopped the server for 190-355 ms
# (docs/benchmarks.md, issue 13). Messages are rebuilt when recovery or history reads.
_Entry = tuple[Any, ...]
_AT, _EPOCH, _SEQ, _FLAT, _BOUND = 0, 1, 2, 5, 10


def _charge(entry: _Entry) -> int:
    """What an entry counts against the budget: its encoded bound and its fields' objects
    (:data:`FIELD_TEXT_MEMORY` for each name and value)."""
    bound: int = entry[_BOUND]
    return bound + FIELD_TEXT_MEMORY * len(entry[_FLAT])


def _entry(message: Message, now: float) -> _Entry:  # ``_value_``: ``.value`` costs ~0.4 µs
    return (
        now, message.epoch, message.seq, message.subject, message.content,
        _flat(message.fields), message.retained, message.qos._value_,
        message.closure, message.type._value_, encoded_bound(message),
    )


def _flat(fields: Mapping[str, str]) -> tuple[str, ...]:
    return tuple(chain.from_iterable(fields.items())) if fields else ()


_QOS = {q._value_: q for q in Qos}
_TYPES = {t._value_: t for t in MessageType}


def _message(entry: _Entry, as_type: MessageType | None = None) -> Message:
    # new_message and the lookups, not Message(), Qos() and MessageType(): 4.5 -> ~1.5 us
    # a message; a cache sync rebuilds every cached message (680,000 of them with the
    # default CacheMemoryBudget), and a resume every one it recovers
    _, epoch, seq, subject, content, flat, retained, qos, closure, kind, _ = entry
    fields = dict(zip(flat[::2], flat[1::2], strict=True)) if flat else {}
    return new_message(
        subject, content, fields, retained, _QOS[qos], closure, epoch, seq,
        _TYPES[kind] if as_type is None else as_type,
    )


class CachedRun:
    """A subject's cached messages, oldest first, taken at one moment (:meth:`SubjectCache.run`)."""

    __slots__ = ("_entries",)

    def __init__(self, entries: tuple[_Entry, ...]) -> None:
        self._entries = entries

    def __len__(self) -> int:
        return len(self._entries)

    def messages(self) -> tuple[Message, ...]:
        return tuple(map(_message, self._entries))

    def bytes(self) -> int:
        """The sum of its messages' ``encoded_bound``."""
        return sum(entry[_BOUND] for entry in self._entries)

    def as_type(self, start: int, end: int, kind: MessageType) -> list[Message]:
        """Its messages ``start`` to ``end`` (indices), each of type ``kind``."""
        return [_message(entry, kind) for entry in self._entries[start:end]]


class SubjectCache:
    """One subject's recent messages of one epoch, in seq order with no holes.

    Keeps at most ``max_messages`` messages (the oldest are dropped on append) and drops
    messages stored more than ``expire_seconds`` ago when ``expire`` is called. The last
    seq ever appended (``last_seq_seen``) survives eviction and expiry, so an emptied cache
    still tells a caught-up subscriber from one it can no longer serve. A new epoch is a
    ``reset``. Times are seconds on any monotonic clock the caller chooses.
    """

    __slots__ = (
        "_budget",
        "_bytes",
        "_entries",
        "_expire_seconds",
        "_largest",
        "_last_seq_seen",
        "_max_messages",
        "_one",
        "_texts",
        "fifo_entries",
        "fifo_key",
        "stale",
    )

    def __init__(
        self,
        *,
        max_messages: int = 1000,
        expire_seconds: float = 180.0,
        last_seq_seen: int = 0,
        budget: CacheBudget | None = None,
    ) -> None:
        """``budget``: the memory budget shared with other subjects' caches
        (:mod:`migratory.model.cache_budget`), which this cache tells of every message it
        takes or drops; the budget's owner calls its ``evict``."""
        if max_messages < 0:
            raise ValueError(f"max_messages must be >= 0, got {max_messages}")
        if expire_seconds < 0:
            raise ValueError(f"expire_seconds must be >= 0, got {expire_seconds}")
        if last_seq_seen < 0:
            raise ValueError(f"last_seq_seen must be >= 0, got {last_seq_seen}")
        self._max_messages = max_messages
        self._expire_seconds = expire_seconds
        self._last_seq_seen = last_seq_seen
        # One entry is held as it is, a deque only from the second: a one-off subject
        # then costs the collector no deque and no wrapper (issue 14: 200,000 one-off
        # subjects were 600,000 tracked objects, a full collection over them ~150 ms); an
        # entry is untracked the first time the collector sees it.
        self._one: _Entry | None = None
        self._entries: deque[_Entry] | None = None
        self._bytes = 0  # sum of encoded_bound() of the cached messages
        self._largest = 0  # largest encoded_bound() cached since the last reset
        self._texts = 0  # field names and values the cached messages hold, for the budget
        self._budget = budget
        self.stale = 0  # the budget's: FIFO entries of messages dropped here
        self.fifo_key = self.fifo_entries = 0  # the budget's too (cache_budget.py)

    @classmethod
    def holding(
        cls, subject: str, epoch: int, seq: int, cached: Sequence[Message], now: float, *,
        max_messages: int, expire_seconds: float, budget: CacheBudget | None,
    ) -> SubjectCache:
        """A cache of ``subject`` at ``(epoch, seq)`` holding ``cached`` (oldest first, as a
        peer holds them; stored at ``now``); ValueError if they do not fit the position."""
        if seq == 0:
            if cached:
                raise ValueError(f"unnumbered {subject!r} cannot have cached messages")
            return cls(max_messages=max_messages, expire_seconds=expire_seconds, budget=budget)
        if cached and cached[-1].seq != seq:
            raise ValueError(f"cached messages of {subject!r} do not end at seq {seq}")
        if any(m.subject != subject or m.epoch != epoch for m in cached):
            raise ValueError(f"cached messages of {subject!r} are not all of its epoch")
        cache = cls(
            max_messages=max_messages, expire_seconds=expire_seconds,
            last_seq_seen=cached[0].seq - 1 if cached else seq, budget=budget,
        )
        try:
            for message in cached:
                if message.type is not MessageType.UPDATE or message.closure is not None:
                    # (a sync's messages are committed ones: updates without closure;
                    # replace() on each was 40 % of installing 600,000 of them)
                    message = replace(message, type=MessageType.UPDATE, closure=None)
                cache.append(message, now)
        except ValueError:
            cache.release()  # not taken: its messages leave the budget
            raise
        return cache

    @property
    def bytes(self) -> int:
        """The sum of :func:`encoded_bound` over the cached messages."""
        return self._bytes

    def bytes_of_newest(self, count: int) -> int:
        """An upper bound, in O(1), of the size of the newest ``count`` cached messages:
        what a subscriber asking for them makes the server encode."""
        if count <= 0:
            return 0
        if count >= len(self):
            return self._bytes
        return min(self._bytes, count * self._largest)

    def __len__(self) -> int:
        if self._entries is not None:
            return len(self._entries)
        return 0 if self._one is None else 1

    def run(self) -> CachedRun:
        """The cached messages as they stand now, kept apart from later changes, rebuilt
        only when read (:meth:`CachedRun.messages`): taking every subject's run is cheap
        enough for the event loop, rebuilding them all is not (a cache sync)."""
        return CachedRun(tuple(self._all))

    def run_until(self, seq: int | None, count: int) -> CachedRun:
        """The newest ``count`` cached messages (fewer if fewer are) up to ``seq`` (None:
        the newest), taken as :meth:`run` takes them, not built."""
        entries = self._all
        if not entries or count <= 0:
            return CachedRun(())
        end = len(entries) if seq is None else min(
            len(entries), max(0, seq + 1 - entries[0][_SEQ]))
        start = max(0, end - count)
        return CachedRun(tuple(islice(entries, start, end)))

    @property
    def _all(self) -> Sequence[_Entry]:
        """The entries, oldest first (a one-tuple made for the read when there is one)."""
        if self._entries is not None:
            return self._entries
        return () if self._one is None else (self._one,)

    def __repr__(self) -> str:
        return (
            f"<SubjectCache {len(self)} messages, seq {self.first_seq}..{self.last_seq},"
            f" last_seq_seen={self._last_seq_seen}>"
        )

    @property
    def max_messages(self) -> int:
        """The count cap."""
        return self._max_messages

    @property
    def expire_seconds(self) -> float:
        """How long a message is kept at least (unless the count cap drops it)."""
        return self._expire_seconds

    @property
    def first_seq(self) -> int | None:
        """Seq of the oldest cached message, None when empty."""
        entries = self._all
        return entries[0][_SEQ] if entries else None

    @property
    def last_seq(self) -> int | None:
        """Seq of the newest cached message, None when empty."""
        entries = self._all
        return entries[-1][_SEQ] if entries else None

    @property
    def last_seq_seen(self) -> int:
        """Seq of the last message ever appended since the last reset (0 if none is known)."""
        return self._last_seq_seen

    def append(self, message: Message, now: float) -> int:
        """Cache ``message``, stored at time ``now``; return how many more messages the
        cache holds (1, or 0 when the oldest made room or nothing is kept).

        Its seq must be exactly ``last_seq_seen + 1`` once any seq is known (and at least 1
        otherwise), and its epoch that of the cached messages; else ValueError.
        """
        seq = message.seq
        if self._last_seq_seen:
            if seq != self._last_seq_seen + 1:
                raise ValueError(
                    f"seq {seq} does not follow last seq {self._last_seq_seen} "
                    f"of {message.subject!r}"
                )
        elif seq < 1:
            raise ValueError(f"seq must be >= 1, got {seq} for {message.subject!r}")
        entries = self._entries
        newest = self._one if entries is None else (entries[-1] if entries else None)
        if newest is not None and message.epoch != newest[_EPOCH]:
            raise ValueError(
                f"epoch {message.epoch} differs from cached epoch {newest[_EPOCH]}"
                f" of {message.subject!r}; reset the cache for a new epoch"
            )
        if message.fields:
            entry = _entry(message, now)
        else:  # _entry written out for the usual message (three calls less per publish)
            entry = (
                now, message.epoch, seq, message.subject, message.content, (),
                message.retained, message.qos._value_, message.closure, message.type._value_,
                message.size(),
            )
        grown = 1
        budget = self._budget
        if entries is not None:  # the usual case of a busy subject: first, and cheap
            if len(entries) == self._max_messages:
                oldest = entries[0]
                self._bytes -= oldest[_BOUND]  # the deque drops it
                self._texts -= len(oldest[_FLAT])
                grown = 0
                if budget is not None:
                    budget.dropped(self, _charge(oldest))
            entries.append(entry)
        elif not self._max_messages:
            self._last_seq_seen = seq
            return 0
        elif self._one is None:
            self._one = entry
        elif self._max_messages == 1:
            oldest = self._one
            self._bytes -= oldest[_BOUND]
            self._texts -= len(oldest[_FLAT])
            self._one = entry
            grown = 0
            if budget is not None:
                budget.dropped(self, _charge(oldest))
        else:
            # untracked: entries only, so the collector need not walk them (untracked.py)
            self._entries = untrack(deque((self._one, entry), maxlen=self._max_messages))
            self._one = None
            if budget is not None:
                budget.bytes += QUEUE_OVERHEAD
        bound = entry[_BOUND]
        self._bytes += bound
        texts = len(entry[_FLAT])
        self._texts += texts
        if bound > self._largest:
            self._largest = bound
        self._last_seq_seen = seq
        if budget is not None:
            budget.added(self, bound + FIELD_TEXT_MEMORY * texts)
        return grown

    def reset(self) -> None:
        """Forget every message and the last seq seen (for a new epoch)."""
        self.release()
        self._last_seq_seen = 0

    def release(self) -> None:
        """Drop every message (the last seq seen stays): the cache is emptied or thrown
        away, and its budget gets their bytes back."""
        if self._budget is not None:
            queue = 0 if self._entries is None else QUEUE_OVERHEAD
            self._budget.dropped(self, self.memory_bytes + queue, len(self))
        self._one = self._entries = None
        self._bytes = self._largest = self._texts = 0

    @property
    def memory_bytes(self) -> int:
        """What the cached messages count against the budget (:func:`_charge`)."""
        return self._bytes + FIELD_TEXT_MEMORY * self._texts

    def drop_oldest(self) -> int:
        """Drop the oldest message for the budget (which counts it itself); what it
        counted (:func:`_charge`), 0 when empty."""
        entries = self._entries
        if entries is None:
            if self._one is None:
                return 0
            oldest: _Entry = self._one
            self._one = None
        else:
            oldest = entries.popleft()
            if len(entries) <= 1:  # one left is held as it is, as after a first append
                self._one = entries[0] if entries else None
                self._entries = None
                self._forget(oldest)
                return _charge(oldest) + QUEUE_OVERHEAD
        self._forget(oldest)
        return _charge(oldest)

    def _forget(self, dropped: _Entry) -> None:
        """Take a dropped entry out of the counts (all of them back to 0 when empty)."""
        self._bytes -= dropped[_BOUND]
        self._texts -= len(dropped[_FLAT])
        if self._one is None and self._entries is None:
            self._bytes = self._largest = self._texts = 0

    def expire(self, now: float) -> int:
        """Drop the messages stored more than ``expire_seconds`` before ``now``; return how many."""
        expire_seconds = self._expire_seconds
        dropped = 0
        before = self.memory_bytes
        entries = self._entries
        if entries is not None:
            before += QUEUE_OVERHEAD
        if entries is None:
            if self._one is not None and now - self._one[_AT] > expire_seconds:
                self._one = None
                dropped = 1
        else:
            while entries and now - entries[0][_AT] > expire_seconds:
                oldest = entries.popleft()
                self._bytes -= oldest[_BOUND]
                self._texts -= len(oldest[_FLAT])
                dropped += 1
            if not entries:
                self._entries = None  # an emptied deque goes too
        if self._one is None and self._entries is None:
            self._bytes = self._largest = self._texts = 0
        if dropped and self._budget is not None:
            after = self.memory_bytes + (0 if self._entries is None else QUEUE_OVERHEAD)
            self._budget.dropped(self, before - after, dropped)
        return dropped

    def since(self, seq: int, limit: int | None = None) -> list[Message] | None:
        """The messages after ``seq``, oldest first (at most ``limit`` of them: a slice of
        a resume), or None when the cache cannot tell.

        None means a gap: the cache no longer reaches back to ``seq + 1``, or ``seq`` is
        beyond the last seq seen. An empty list means the caller is up to date.
        """
        if seq < 0:
            raise ValueError(f"seq must be >= 0, got {seq}")
        if seq > self._last_seq_seen:
            return None
        entries = self._all
        if not entries:
            return [] if seq == self._last_seq_seen else None
        start = seq + 1 - entries[0][_SEQ]
        if start < 0:
            return None
        if limit is not None and len(entries) - start > limit:
            return [_message(entry) for entry in islice(entries, start, start + limit)]
        return self._newest(len(entries) - start)

    def last(self, n: int) -> list[Message]:
        """The newest ``n`` cached messages (fewer if fewer are cached), oldest first."""
        if n <= 0:
            return []
        return self._newest(min(n, len(self)))

    def _newest(self, count: int) -> list[Message]:
        """The newest ``count`` messages, oldest first, walking from the nearer end."""
        entries = self._all
        skip = len(entries) - count
        if count <= skip:
            newest = [_message(entry) for entry in islice(reversed(entries), count)]
            newest.reverse()
            return newest
        return [_message(entry) for entry in islice(entries, skip, None)]
