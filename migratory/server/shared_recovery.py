"""The messages a resume recovers, built and encoded once for every client resuming a
subject from the same position (a thundering herd: a member's clients coming back after
a failover, all caught up to about the same message).

Each resume rebuilt its missed messages from the cache, made a recovered copy of each
and encoded the batch: 1,000 clients resuming 10 subjects 100 messages back were 1.9 s
of the event loop without a pause (every other client waiting, the readiness probe
too; docs/benchmarks.md, "A thundering herd of resumes"). The batch depends only on the
subject, its epoch, the position resumed from, the subject's last seq and the oldest
seq its cache holds (an eviction changes that one: a resume from a dropped message is
told DATA_RESYNC as before), so those name it here; the recovered ``Deliver`` and its
frame are kept for the next resume with the same name, a few of them, least recently
used first out, and bounded in messages held. Pure: the caller encodes.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable
from typing import NamedTuple

from migratory.model.message import Message, MessageType
from migratory.model.position import Position
from migratory.protocol import ops

__all__ = ["MAX_BATCHES", "MAX_BYTES", "MAX_MESSAGES", "BatchKey", "Recovered",
           "SharedRecovery"]

MAX_BATCHES = 64
"""Recovered batches kept at once."""
MAX_MESSAGES = 20_000
"""Messages those batches hold together at most."""
MAX_BYTES = 32 << 20
"""Bytes they hold at most: their messages' contents (shared with the cache while it
keeps them) and their frames once encoded (each bounded by the client's pending limit,
as every answer)."""


class BatchKey(NamedTuple):
    subject: str
    epoch: int
    since: Position
    last_seq: int
    first_cached: int | None


class Recovered:
    """One recovered batch: the messages missed (as the cache gave them) and the
    ``Deliver`` of their recovered copies, its frame once encoded."""

    __slots__ = ("bytes", "deliver", "frame", "missed")

    def __init__(self, missed: list[Message], deliver: ops.Deliver) -> None:
        self.missed = missed
        self.deliver = deliver
        self.frame: bytes | None = None
        self.bytes = sum(len(m.content) for m in missed)  # and the frame's, once encoded


class SharedRecovery:
    __slots__ = ("_batches", "_by_deliver", "_bytes", "_messages", "built", "shared")

    def __init__(self) -> None:
        self._batches: OrderedDict[BatchKey, Recovered] = OrderedDict()
        self._by_deliver: dict[int, Recovered] = {}  # id(deliver) -> its batch
        self._messages = 0
        self._bytes = 0
        self.built = 0  # batches built (tests count them)
        self.shared = 0  # resumes answered with a batch already built

    def batch(self, key: BatchKey, build: Callable[[], list[Message] | None]) -> Recovered | None:
        """The batch named ``key``, built with ``build`` (the missed messages, None when
        the cache cannot tell them) unless kept; None when ``build`` says None."""
        kept = self._batches.get(key)
        if kept is not None:
            self._batches.move_to_end(key)
            self.shared += 1
            return kept
        missed = build()
        if missed is None:
            return None
        recovered = Recovered(missed, ops.Deliver(tuple(
            m.as_type(MessageType.RECOVERED) for m in missed)))
        self.built += 1
        if missed and len(missed) <= MAX_MESSAGES and recovered.bytes <= MAX_BYTES:
            self._keep(key, recovered)
        return recovered

    def frame(self, op: ops.ServerOp, encode: Callable[[ops.ServerOp], bytes]) -> bytes:
        """``op`` encoded with ``encode``; once for a kept batch's ``Deliver``."""
        recovered = self._by_deliver.get(id(op))
        if recovered is None or recovered.deliver is not op:
            return encode(op)
        frame = recovered.frame
        if frame is None:
            frame = recovered.frame = encode(op)
            recovered.bytes += len(frame)
            self._bytes += len(frame)
            self._shrink()
        return frame

    @property
    def held(self) -> tuple[int, int]:
        """Messages and bytes the batches kept hold."""
        return self._messages, self._bytes

    def _keep(self, key: BatchKey, recovered: Recovered) -> None:
        batches = self._batches
        batches[key] = recovered
        self._by_deliver[id(recovered.deliver)] = recovered
        self._messages += len(recovered.missed)
        self._bytes += recovered.bytes
        self._shrink()

    def _shrink(self) -> None:
        batches = self._batches
        while batches and (len(batches) > MAX_BATCHES or self._messages > MAX_MESSAGES
                           or self._bytes > MAX_BYTES):
            _, dropped = batches.popitem(last=False)
            del self._by_deliver[id(dropped.deliver)]
            self._messages -= len(dropped.missed)
            self._bytes -= dropped.bytes
