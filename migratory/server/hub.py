"""The hub: per-subject state and fan-out of pre-encoded frames.

No I/O here. A subscriber is any :class:`Sink` (the server's sessions);
the hub numbers each published message with the subject's next position,
caches it, merges it into the snapshot, encodes it **once** into a
ready-to-write WebSocket frame and hands that same bytes object to every
subscriber. Conflated subscriptions get their own merged frames on
:meth:`Hub.tick`.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Protocol

from migratory.model.cache import SubjectCache
from migratory.model.conflation import Conflator, round_conflation_ms
from migratory.model.message import Message, MessageType
from migratory.model.position import Position
from migratory.model.snapshot import merge_snapshot
from migratory.protocol import ops
from migratory.protocol.websocket import encode_binary


class Sink(Protocol):
    def deliver(self, frame: bytes) -> None: ...


def message_frame(message: Message) -> bytes:
    """One message as a complete server WebSocket frame."""
    return encode_binary(ops.encode_message(message))


class SubjectState:
    """Everything the hub knows about one subject."""

    __slots__ = ("cache", "conflated", "epoch", "seq", "snapshot", "subject", "subscribers")

    def __init__(self, subject: str, epoch: int, cache: SubjectCache) -> None:
        self.subject = subject
        self.epoch = epoch
        self.seq = 0
        self.cache = cache
        self.snapshot: Message | None = None
        # dicts used as insertion-ordered sets: deterministic fan-out order
        self.subscribers: dict[Sink, None] = {}
        self.conflated: dict[Sink, Conflator] = {}

    @property
    def position(self) -> Position:
        return Position(self.epoch, self.seq)

    @property
    def idle(self) -> bool:
        """No subscribers and nothing ever published: safe to forget."""
        return self.seq == 0 and not self.subscribers and not self.conflated


@dataclass(frozen=True, slots=True)
class HubStatistics:
    subjects: int
    subscriptions: int
    messages_published: int
    frames_fanned_out: int


class Hub:
    def __init__(
        self,
        *,
        epoch: int,
        max_cached_messages: int = 1000,
        cache_expire_seconds: float = 180.0,
        publish_snapshot: bool = True,
    ) -> None:
        self.epoch = epoch
        self._max_cached = max_cached_messages
        self._cache_expire = cache_expire_seconds
        self._publish_snapshot = publish_snapshot
        self._subjects: dict[str, SubjectState] = {}
        self._with_conflation: set[SubjectState] = set()
        self._published = 0
        self._fanned_out = 0

    # --- publishing ---------------------------------------------------------

    def publish(self, message: Message, now: float) -> Message:
        """Number ``message`` with its subject's next position and fan it out."""
        state = self._state(message.subject)
        positioned = replace(
            message, epoch=state.epoch, seq=state.seq + 1, type=MessageType.UPDATE, closure=None
        )
        self._apply(state, positioned, now)
        return positioned

    def apply(self, message: Message, now: float) -> bool:
        """Take a message already numbered elsewhere (the cluster's coordination).

        It must be the subject's next position: same epoch and seq + 1, or a new epoch
        (the cache then restarts). Returns False, changing nothing, for a message at or
        before the subject's position (already applied); raises ValueError on a gap,
        which the caller must repair by syncing the cache from a peer.
        """
        state = self._state(message.subject)
        if message.epoch == state.epoch:
            if message.seq <= state.seq:
                return False
            if message.seq != state.seq + 1:
                raise ValueError(
                    f"gap on {message.subject!r}: at seq {state.seq}, got {message.seq}"
                )
        else:
            state.epoch = message.epoch
            state.cache.reset()
            if message.seq != 1:
                state.cache = SubjectCache(
                    max_messages=self._max_cached,
                    expire_seconds=self._cache_expire,
                    last_seq_seen=message.seq - 1,
                )
        self._apply(state, replace(message, type=MessageType.UPDATE, closure=None), now)
        return True

    def _apply(self, state: SubjectState, message: Message, now: float) -> None:
        state.seq = message.seq
        state.cache.append(message, now)
        if message.retained:
            state.snapshot = merge_snapshot(state.snapshot, message)
        self._published += 1
        subscribers = state.subscribers
        if subscribers:
            frame = message_frame(message)
            # a copy: a sink may drop out (slow consumer) while we fan out
            for sink in tuple(subscribers):
                sink.deliver(frame)
            self._fanned_out += len(subscribers)
        for conflator in state.conflated.values():
            conflator.offer(message)  # offer() never calls out

    # --- subscribing --------------------------------------------------------

    def subscribe(
        self, sink: Sink, request: ops.SubscriptionRequest, now: float
    ) -> list[ops.ServerOp]:
        """Register ``sink`` and return what it must receive first, in order.

        The subject must already be validated and entitled by the caller.
        """
        state = self._state(request.subject)
        self._drop_subscription(state, sink)
        period = round_conflation_ms(request.conflation_ms)
        if period:
            state.conflated[sink] = Conflator(period_ms=period, start=now)
            self._with_conflation.add(state)
        else:
            state.subscribers[sink] = None
        if request.position is None:
            return self._fresh(state, request.history)
        return self._resume(state, request.position)

    def _fresh(self, state: SubjectState, history: int) -> list[ops.ServerOp]:
        out: list[ops.ServerOp] = [
            ops.SubjectStatus(ops.Status.SUBSCRIBE_ALLOW, state.subject, state.position)
        ]
        if history > 0:
            historical = [
                m.as_type(MessageType.HISTORICAL) for m in state.cache.last(history)
            ]
            if historical:
                out.append(ops.Deliver(tuple(historical)))
        elif self._publish_snapshot and state.snapshot is not None:
            out.append(ops.Deliver((state.snapshot,)))
        return out

    def _resume(self, state: SubjectState, position: Position) -> list[ops.ServerOp]:
        out: list[ops.ServerOp] = [
            ops.SubjectStatus(ops.Status.SUBSCRIBE_ALLOW, state.subject)
        ]
        missed = state.cache.since(position.seq) if position.epoch == state.epoch else None
        if missed is None:
            if state.snapshot is not None:
                out.append(ops.Deliver((state.snapshot,)))
            status = ops.Status.DATA_RESYNC
        else:
            if missed:
                out.append(
                    ops.Deliver(tuple(m.as_type(MessageType.RECOVERED) for m in missed))
                )
            status = ops.Status.DATA_SYNC
        out.append(ops.SubjectStatus(status, state.subject, state.position))
        return out

    def unsubscribe(self, sink: Sink, subject: str) -> None:
        state = self._subjects.get(subject)
        if state is None:
            return
        self._drop_subscription(state, sink)
        if state.idle:
            del self._subjects[subject]

    def _drop_subscription(self, state: SubjectState, sink: Sink) -> None:
        state.subscribers.pop(sink, None)
        if state.conflated.pop(sink, None) is not None and not state.conflated:
            self._with_conflation.discard(state)

    # --- time ---------------------------------------------------------------

    def tick(self, now: float) -> None:
        """Emit due conflated messages."""
        for state in list(self._with_conflation):
            for sink, conflator in list(state.conflated.items()):
                merged = conflator.poll(now)
                if merged is not None:
                    sink.deliver(message_frame(merged))
                    self._fanned_out += 1

    def expire(self, now: float) -> int:
        """Drop cached messages older than the cache expire time."""
        return sum(state.cache.expire(now) for state in self._subjects.values())

    # --- queries ------------------------------------------------------------

    def snapshot(self, subject: str) -> Message | None:
        state = self._subjects.get(subject)
        return None if state is None else state.snapshot

    def position(self, subject: str) -> Position | None:
        state = self._subjects.get(subject)
        return None if state is None else state.position

    def statistics(self) -> HubStatistics:
        return HubStatistics(
            subjects=len(self._subjects),
            subscriptions=sum(
                len(s.subscribers) + len(s.conflated) for s in self._subjects.values()
            ),
            messages_published=self._published,
            frames_fanned_out=self._fanned_out,
        )

    def _state(self, subject: str) -> SubjectState:
        state = self._subjects.get(subject)
        if state is None:
            cache = SubjectCache(
                max_messages=self._max_cached, expire_seconds=self._cache_expire
            )
            state = self._subjects[subject] = SubjectState(subject, self.epoch, cache)
        return state
