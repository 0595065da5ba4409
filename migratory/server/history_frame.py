"""A history answer made in slices, over several turns of the loop.

A native client subscribing with a history gets it in one frame, a ``batch`` of the
cached messages typed ``historical``. Made in one step, that was 26-53 ms of the event
loop for 10,000 cached messages (``MaxCachedMessagesPerSubject`` raised;
docs/benchmarks.md), and several clients asking at once added up. :class:`HistoryFrame`
makes the same frame, byte for byte, a slice of messages at a time: a CBOR array of
definite length is its header and its items one after the other, so the items of each
slice are encoded on their own and joined at the end. The messages are the cached
entries taken when the subscribe was answered (:meth:`SubjectCache.run_until`), so what
is published or evicted meanwhile changes nothing in it.

Its session keeps the frame's place in the outbox (``Outbox.hold``) and subscribes the
client at once, as before: what comes meanwhile -- live messages, statuses -- waits
behind it there and goes out after it, in the order it came.
"""

from __future__ import annotations

import cbor2

from migratory.model.cache import CachedRun
from migratory.model.message import MessageType
from migratory.protocol import ops
from migratory.protocol.websocket import encode_binary

__all__ = ["HISTORY_SLICE", "HistoryFrame", "SlicedHistory"]

HISTORY_SLICE = 128
"""Messages of a history a slice encodes; a history of at most this many is answered
whole, in the subscribe's step, as before."""

_BATCH_HEAD = cbor2.dumps({"op": "batch", "messages": []})[:-1]  # up to the array's header


def _array_header(count: int) -> bytes:
    """The CBOR header of an array of ``count`` items (definite length)."""
    if count < 24:
        return bytes((0x80 | count,))
    if count < 0x100:
        return bytes((0x98, count))
    if count < 0x10000:
        return b"\x99" + count.to_bytes(2, "big")
    if count < 0x1_0000_0000:
        return b"\x9a" + count.to_bytes(4, "big")
    return b"\x9b" + count.to_bytes(8, "big")


class HistoryFrame:
    """The ``batch`` frame of a history, made a slice at a time."""

    __slots__ = ("_done", "_parts", "_run", "bound")

    def __init__(self, run: CachedRun, bound: int) -> None:
        self._run = run
        self._done = 0
        self._parts = [_BATCH_HEAD, _array_header(len(run))]
        self.bound = bound
        """At most the frame's bytes (what its place in the outbox counts for)."""

    def __len__(self) -> int:
        return len(self._run)

    @property
    def made(self) -> bool:
        return self._done == len(self._run)

    def advance(self, count: int) -> tuple[int, int]:
        """Encode the next ``count`` messages (fewer at the end): how many, and the bytes
        of their contents (the work they count for)."""
        start = self._done
        messages = self._run.as_type(start, start + count, MessageType.HISTORICAL)
        if messages:
            items = cbor2.dumps([ops.message_map(m) for m in messages])
            self._parts.append(items[len(_array_header(len(messages))):])
        self._done = start + len(messages)
        return len(messages), sum(len(m.content) for m in messages)

    def frame(self) -> bytes:
        """The whole frame, once :attr:`made`."""
        assert self.made, "the history is not made yet"
        return encode_binary(b"".join(self._parts))


class SlicedHistory(ops.Deliver):
    """In a hub's answer (``sliced_history``), in place of the ``Deliver`` of a history
    longer than :data:`HISTORY_SLICE`: its frame, to be made in slices (``messages`` is
    empty)."""

    __slots__ = ("history",)

    def __init__(self, history: HistoryFrame) -> None:
        super().__init__(())
        object.__setattr__(self, "history", history)

    history: HistoryFrame
