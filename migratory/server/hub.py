"""The hub: per-subject state and fan-out of pre-encoded frames.

No I/O here. A subscriber is any :class:`Sink` (the server's sessions);
the hub numbers each published message with the subject's next position,
caches it, merges it into the snapshot, encodes it **once** into a
ready-to-write WebSocket frame and hands that same bytes object to every
subscriber. Conflated subscriptions get their own merged frames on
:meth:`Hub.tick`.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from dataclasses import replace

from migratory.model.cache import CachedRun, SubjectCache
from migratory.model.cache_budget import CacheBudget
from migratory.model.conflation import Conflator, offer_run_to, offer_to, round_conflation_ms
from migratory.model.message import Message, MessageType, new_message
from migratory.model.position import Position, new_epoch
from migratory.model.snapshot import merge_snapshot
from migratory.model.subject import is_valid_subject
from migratory.model.subject_index import SubjectIndex
from migratory.model.topic import FilterIndex
from migratory.protocol import ops
from migratory.server.answer_bound import answer_bytes
from migratory.server.faults import DeliveryFault, DeliveryFaults
from migratory.server.format_sink import (
    AnySink,
    FormatSink,
    MessageSink,
    MissedRun,
    Sink,
    message_frame,
    send_message,
    send_missed,
    send_op,
    tell_missed,
)
from migratory.server.hub_expiry import SubjectExpiry
from migratory.server.hub_resume import ResumeCursor, SlicedResumes, history_op
from migratory.server.hub_settle import WaitingResumes
from migratory.server.hub_sinks import FilterAges, MessageSinks, SessionHolds
from migratory.server.hub_statistics import HubStatistics
from migratory.server.shared_recovery import SharedRecovery
from migratory.server.subject_state import SubjectState, WaitingResume

__all__ = ["AnySink", "FormatSink", "Hub", "MessageSink", "ResumeCursor", "Sink",
           "message_frame"]


class Hub(SlicedResumes, WaitingResumes, SubjectExpiry, MessageSinks):
    def __init__(
        self,
        *,
        epoch: int,
        max_cached_messages: int = 1000,
        cache_expire_seconds: float = 180.0,
        publish_snapshot: bool = True,
        numbered_elsewhere: bool = False,
        cache_memory_budget: int = 0,
        max_message_size: int = 0,
        on_invalid_subject: Callable[[str], None] | None = None,
        hold_sessions: bool = False,
    ) -> None:
        """``numbered_elsewhere``: a cluster member whose positions come from the
        coordination (``apply``); its ``epoch`` then only marks subjects not numbered yet.
        ``cache_memory_budget``: bytes every subject's cache together may count (0: no
        budget; :mod:`migratory.model.cache_budget`). ``max_message_size``: what a
        conflated message may reach at most (0: no bound; :class:`Conflator`).
        ``on_invalid_subject``: told of a subject that is not valid when it comes in
        numbered (:mod:`migratory.server.invalid_subjects`). ``hold_sessions``: keep the
        filters of persistent MQTT sessions while their client is away too, for
        :meth:`made` (a Standard member: :class:`SessionHolds`)."""
        self._on_invalid_subject = on_invalid_subject
        self.epoch = epoch
        self.numbered_elsewhere = numbered_elsewhere
        # test-only, see migratory.server.faults
        self.fault: DeliveryFault | DeliveryFaults | None = None
        self._max_cached = max_cached_messages
        self._cache_expire = cache_expire_seconds
        self._publish_snapshot = publish_snapshot
        # the recovered batches of resumes from one position, built and encoded once
        self.recovery = SharedRecovery()
        self._max_message_size = max_message_size
        self._subjects: dict[str, SubjectState] = {}
        self._index: SubjectIndex[SubjectState] = SubjectIndex()  # the same, by levels
        self.subjects_visited = 0  # by wildcard scans (hub_sinks.SubjectScan)
        # subjects with a conflated message waiting for its period's end: Hub.tick looks
        # at them only (all conflated subscriptions each tick: 72 ms per 100,000)
        self._conflating: set[SubjectState] = set()
        self._filters: FilterIndex[MessageSink] = FilterIndex()  # wildcard subscriptions
        self._filter_ages = FilterAges()  # since when each filter is held (made)
        # a Standard member's persistent MQTT sessions' filters, away ones too (made)
        self._session_holds = SessionHolds() if hold_sessions else None
        self._published = 0
        self._fanned_out = 0
        self._unnamable = 0  # (MessageSinks._granted)
        # grows whenever a subject is made or a wildcard filter first held: a moment
        # (what was held before it is made at or below; ``made``)
        self.holdings_made = 0
        self._forgotten = 0  # spent subjects forgotten (see expire)
        self._forgotten_since_shrink = 0
        self._expire_queue: list[str] = []  # subjects an expire sweep has yet to look at
        # kept as they change, so statistics() is O(1) whatever the number of subjects
        # (summing over 200,000 subjects once a second stopped the loop ~50 ms)
        self._sinks = 0  # SubjectState.sinks over every subject
        self._cached = 0  # len(SubjectState.cache) over every subject
        self._budget = CacheBudget(cache_memory_budget) if cache_memory_budget else None

    # --- publishing ---------------------------------------------------------

    def publish(self, message: Message, now: float) -> Message:
        """Number ``message`` with its subject's next position and fan it out."""
        state = self._subjects.get(message.subject)  # (_state's lookup inline: per publish)
        if state is None:
            state = self._state(message.subject)
        positioned = new_message(  # not dataclasses.replace: ~3 % of a publish's CPU
            message.subject, message.content, message.fields, message.retained, message.qos,
            None, state.epoch, state.seq + 1, MessageType.UPDATE,
        )
        self._apply(state, positioned, now)
        return positioned

    def apply(self, message: Message, now: float) -> bool:
        """Take a message already numbered elsewhere (the cluster's coordination).

        It must be the subject's next position: same epoch and seq + 1, or a new epoch
        from its seq 1 (the cache restarts; any seq for a subject with no position yet:
        mid-lineage it was a new cluster's stream over an old one's, 44bef4a). False,
        changing nothing, for a message at or before the subject's position (applied);
        ValueError on a gap, which the caller repairs by syncing the cache from a peer."""
        state = self._state(message.subject)
        if message.epoch == state.epoch:
            if message.seq <= state.seq:
                return False
            if message.seq != state.seq + 1:
                raise ValueError(
                    f"gap on {message.subject!r}: at seq {state.seq}, got {message.seq}"
                )
        elif state.seq > 0 and message.seq != 1:
            raise ValueError(
                f"gap on {message.subject!r}: at {state.epoch}/{state.seq}, got seq "
                f"{message.seq} of another epoch, {message.epoch}"
            )
        else:
            state.epoch = message.epoch
            self._cached -= len(state.cache)
            state.cache.reset()
            if message.seq != 1:
                state.cache = SubjectCache(
                    max_messages=self._max_cached,
                    expire_seconds=self._cache_expire,
                    last_seq_seen=message.seq - 1,
                    budget=self._budget,
                )
        if message.type is not MessageType.UPDATE or message.closure is not None:
            message = replace(message, type=MessageType.UPDATE, closure=None)
        self._apply(state, message, now)
        return True

    def _apply(self, state: SubjectState, message: Message, now: float) -> None:
        state.seq = message.seq
        self._cached += state.cache.append(message, now)
        budget = self._budget
        if budget is not None and budget.bytes > budget.limit:
            self._cached -= budget.evict()
        if message.retained:
            state.snapshot = merge_snapshot(state.snapshot, message)
        self._published += 1
        subscribers = state.subscribers
        if subscribers:
            frame = message_frame(message)
            if self.fault is not None:
                self.fault.fan_out(frame, subscribers, state.subject)
            else:
                # a copy: a sink may drop out (slow consumer) while we fan out
                for sink in tuple(subscribers):
                    sink.deliver(frame)
            self._fanned_out += len(subscribers)
        if state.formatted:
            self._fan_out_formatted(state, message)
        if state.conflated:
            offer_to(state.conflated.values(), message, now)  # never calls out
            self._conflating.add(state)
        if state.listeners or self._filters.count:  # (its __len__ is a call)
            self._tell_listeners(state, message)
        if state.waiting and self._may_settle(state):
            self._settle_waiting(state, now)

    def _fan_out_formatted(self, state: SubjectState, message: Message) -> None:
        frames: dict[object, bytes] = {}
        for sink in tuple(state.formatted):
            sink.deliver_formatted(message, frames)
        self._fanned_out += len(state.formatted)

    # --- subscribing --------------------------------------------------------

    def subscribe(
        self, sink: AnySink, request: ops.SubscriptionRequest, now: float
    ) -> list[ops.ServerOp]:
        """Register ``sink`` and return what it must receive first, in order.

        The subject must already be validated and entitled by the caller.
        """
        return self.start_resume(sink, request, now, None)[0]

    def start_resume(
        self, sink: AnySink, request: ops.SubscriptionRequest, now: float, limit: int | None,
        *, sliced_history: bool = False,
    ) -> tuple[list[ops.ServerOp], ResumeCursor | None]:
        """As :meth:`subscribe`, a resume recovering at most ``limit`` messages (None: all
        of them); the cursor of the rest (:meth:`continue_resume`), None if none is left
        (:mod:`migratory.server.hub_resume`). ``sliced_history``: a history of more than
        ``HISTORY_SLICE`` messages is answered as a :class:`SlicedHistory`, its frame
        made by the caller in slices (:mod:`migratory.server.history_frame`)."""
        state = self._state(request.subject)
        sinks = state.sinks
        try:
            return self._subscribe(state, sink, request, now, limit, sliced_history)
        finally:
            self._sinks += state.sinks - sinks

    def _subscribe(
        self, state: SubjectState, sink: AnySink, request: ops.SubscriptionRequest, now: float,
        limit: int | None, sliced: bool,
    ) -> tuple[list[ops.ServerOp], ResumeCursor | None]:
        self._drop_subscription(state, sink)
        period = round_conflation_ms(request.conflation_ms)
        position = request.position
        allow = ops.SubjectStatus(ops.Status.SUBSCRIBE_ALLOW, state.subject)
        if position is not None and self._ahead(state, position):
            # A member lagging behind the cluster: answering now would move the client
            # back. Nothing until this member reaches the client's position.
            self._wait(state, sink,
                       WaitingResume(position, period, request.snapshot, request.history))
            return [allow], None
        if position is not None and self._unplaced(state, position):
            # No position here for a subject the client has one of: this member lags
            # (not numbered here yet) or forgot it (spent, see expire). It waits as above,
            # so that a lagging member does not repeat what the client has when it
            # catches up. A subject never forgotten here lags: nothing to say until the
            # member catches up (one restarted or just added, where the clients of a
            # member that left resume; was DATA_RESYNC, then DATA_SYNC once caught up).
            # One it may have forgotten: DATA_RESYNC now, the position kept.
            self._wait(state, sink,
                       WaitingResume(position, period, request.snapshot, request.history))
            if not self.may_have_forgotten(state.subject):
                return [allow], None
            return [allow, ops.SubjectStatus(ops.Status.DATA_RESYNC, state.subject, None)], None
        if position is None:
            self._add_subscription(state, sink, period, now)
            return self._fresh(state, request.history, sliced), None
        answer, cursor = self._resume_from(state, sink, request, period, now, limit, sliced)
        return [allow, *answer], cursor

    def _ahead(self, state: SubjectState, position: Position) -> bool:
        """``position`` is later than this member's position of the same lineage."""
        return (
            self.numbered_elsewhere and position.epoch == state.epoch and position.seq > state.seq
        )

    def _unplaced(self, state: SubjectState, position: Position) -> bool:
        """Nothing numbered here yet and the client is in a lineage we do not know."""
        return (
            self.numbered_elsewhere and state.seq == 0 and position.epoch != state.epoch
        )

    def _add_subscription(
        self, state: SubjectState, sink: AnySink, period: int, now: float
    ) -> None:
        if period:
            shared = next(iter(state.conflated.values()), None)  # the subject's timeline
            state.conflated[sink] = Conflator(
                period_ms=period, start=now, max_size=self._max_message_size,
                timeline=None if shared is None else shared.timeline,
            )
        elif isinstance(sink, FormatSink):
            state.formatted[sink] = None
        else:
            state.subscribers[sink] = None

    def _fresh(self, state: SubjectState, history: int, sliced: bool) -> list[ops.ServerOp]:
        out: list[ops.ServerOp] = [
            ops.SubjectStatus(ops.Status.SUBSCRIBE_ALLOW, state.subject, state.position)
        ]
        if history > 0:
            deliver = history_op(state.cache.run_until(None, history), sliced)
            if deliver is not None:
                out.append(deliver)
        elif self._publish_snapshot and state.snapshot is not None:
            out.append(ops.Deliver((state.snapshot,)))
        return out

    def answer_bytes(self, request: ops.SubscriptionRequest) -> int:
        """An upper bound of the bytes :meth:`subscribe` would answer ``request`` with
        (:mod:`migratory.server.answer_bound`)."""
        return answer_bytes(self._subjects.get(request.subject), request,
                            unnumbered=Position(self.epoch, 0),
                            publish_snapshot=self._publish_snapshot)

    def unsubscribe(self, sink: AnySink, subject: str) -> None:
        state = self._subjects.get(subject)
        if state is None:
            return
        sinks = state.sinks
        self._drop_subscription(state, sink)
        self._sinks += state.sinks - sinks
        if state.idle:
            self._forget(state)

    def _drop_subscription(self, state: SubjectState, sink: AnySink) -> None:
        if isinstance(sink, FormatSink):
            state.formatted.pop(sink, None)
        else:
            state.subscribers.pop(sink, None)
        state.waiting.pop(sink, None)
        state.settling.pop(sink, None)
        conflator = state.conflated.pop(sink, None)
        if conflator is not None:
            conflator.release()
            if not state.conflated:
                self._conflating.discard(state)

    # --- time ---------------------------------------------------------------

    def tick(self, now: float) -> None:
        """Emit due conflated messages (of the subjects that have some waiting)."""
        for state in list(self._conflating):
            waiting = False
            frames: dict[int, dict[object, bytes]] = {}  # by message: one union encoded once
            for sink, conflator in list(state.conflated.items()):
                if not conflator.has_pending:
                    continue
                merged = conflator.poll(now)
                if merged is not None:
                    send_message(sink, merged, frames.setdefault(id(merged), {}))
                    self._fanned_out += 1
                else:
                    waiting = True
            shared = next(iter(state.conflated.values()), None)
            if shared is not None:
                shared.timeline.forget_emitted()
            if not waiting:
                self._conflating.discard(state)

    @property
    def subject_count(self) -> int:
        return len(self._subjects)

    # --- repositioning (a cluster member taking a peer's cache) ---------------

    def subject_names(self) -> list[str]:
        """Every subject held, numbered or not: a copy, taken at C speed."""
        return list(self._subjects)

    def numbered(self) -> Iterator[tuple[str, Position, Message | None, CachedRun]]:
        """Every subject with a position: ``(subject, position, snapshot, cached)``, the
        cached messages as a :class:`CachedRun` (oldest first, rebuilt when read)."""
        for state in self._subjects.values():
            if state.seq > 0:
                yield state.subject, state.position, state.snapshot, state.cache.run()

    def reposition(
        self,
        subject: str,
        position: Position,
        snapshot: Message | None,
        cached: Sequence[Message],
        now: float,
    ) -> None:
        """Move ``subject`` to ``position`` with ``snapshot`` and ``cached`` (oldest first,
        ending at ``position``), as a peer holds it; ``position.seq == 0`` makes the subject
        unnumbered again. Live subscribers get the messages the move jumped over, or the
        snapshot and ``DATA_RESYNC`` -- never a silent gap. Cached messages count as stored
        at ``now``. Raises ValueError, changing nothing, when ``cached`` does not fit."""
        cache = SubjectCache.holding(  # ValueError if ``cached`` does not fit ``position``
            subject, position.epoch, position.seq, cached, now, max_messages=self._max_cached,
            expire_seconds=self._cache_expire, budget=self._budget,
        )
        state = self._subjects.get(subject)
        if state is None:
            if position.seq == 0:
                return
            state = self._state(subject)
        listeners = self._granted(state)  # by name, or by a wildcard filter matching it
        live = state.subscribers or state.formatted or state.conflated or listeners
        before = state.position if live else None
        state.epoch, state.seq = position.epoch, position.seq
        state.snapshot = snapshot if position.seq else None
        self._cached += len(cache) - len(state.cache)
        state.cache.release()
        state.cache = cache
        budget = self._budget
        if budget is not None and budget.bytes > budget.limit:
            self._cached -= budget.evict()
        if before is not None:
            self._catch_up_live(state, before, listeners, now)
        if state.waiting:
            self._settle_waiting(state, now)
        if state.idle:
            self._forget(state)

    def _catch_up_live(
        self, state: SubjectState, before: Position,
        listeners: tuple[tuple[MessageSink, int], ...], now: float,
    ) -> None:
        """Live subscribers were at ``before`` when the subject moved: give them the
        messages it jumped over, or the snapshot and ``DATA_RESYNC`` (an MQTT session:
        its resync, :meth:`MessageSink.resync`). Before, an MQTT session got the snapshot
        as a plain live PUBLISH, not counted -- or nothing when the subject had none: a
        gap its client could not see
        (``test_mqtt_resync_live.py::test_a_jump_past_the_cache_is_an_mqtt_resync``).
        The messages go as one :class:`MissedRun`: to a native session, an SSE stream
        of one subject, a clean MQTT session at QoS 0, one append per run of them, not
        per message (``format_sink.send_missed``, ``tell_missed``)."""
        if state.position == before:
            return
        missed = self._missed(state, before)
        run = None if missed is None else MissedRun(missed)  # encoded and joined once
        if run is None:
            for listener, qos in listeners:  # they drop what they have
                listener.resync(state.subject, state.position, state.snapshot, qos)
        else:
            tell_missed(listeners, run)
        if missed is not None and run is not None:
            live_sinks: tuple[AnySink, ...] = (*state.subscribers, *state.formatted)
            if live_sinks and missed:  # a few appends each
                for sink in live_sinks:
                    send_missed(sink, run)
                self._fanned_out += len(live_sinks) * len(missed)
            if state.conflated and missed:  # once, folded, as a period merges them
                offer_run_to(state.conflated.values(), missed, now)
                self._conflating.add(state)
            return
        resync: list[ops.ServerOp] = []
        if state.snapshot is not None:
            resync.append(ops.Deliver((state.snapshot,)))
        resync.append(ops.SubjectStatus(ops.Status.DATA_RESYNC, state.subject, state.position))
        for sink in (*state.subscribers, *state.formatted, *state.conflated):
            for op in resync:
                send_op(sink, op)

    # --- queries ------------------------------------------------------------

    def snapshot(self, subject: str) -> Message | None:
        state = self._subjects.get(subject)
        return None if state is None else state.snapshot

    def position(self, subject: str) -> Position | None:
        state = self._subjects.get(subject)
        return None if state is None else state.position

    def made(self, subject: str) -> int | None:
        """The moment (:attr:`holdings_made`) since which ``subject`` has been held here:
        when its state was made, a wildcard filter matching it first held, or a filter
        of a persistent MQTT session (away too) matching it, the oldest (None: none --
        no one here to miss a message of it). Whoever holds it now came after whatever
        happened while that count was lower."""
        state = self._subjects.get(subject)
        made = None if state is None else state.made
        for since in self._filters_held_since(subject):
            if made is None or since < made:
                made = since
        return made

    @property
    def activity(self) -> int:
        """Grows with every message published or fanned out: unchanged means idle."""
        return self._published + self._fanned_out

    def statistics(self) -> HubStatistics:
        """O(1): the counts are kept as subscriptions and caches change."""
        return HubStatistics(
            subjects=len(self._subjects),
            subscriptions=len(self._filters) + self._sinks,
            messages_published=self._published,
            frames_fanned_out=self._fanned_out,
            cached_messages=self._cached,
            cache_bytes=0 if self._budget is None else self._budget.bytes,
            cache_evicted=0 if self._budget is None else self._budget.evicted,
            subjects_forgotten=self._forgotten,
            mqtt_unnamable_messages=self._unnamable,
        )

    def _state(self, subject: str) -> SubjectState:
        state = self._subjects.get(subject)
        if state is None:
            cache = SubjectCache(
                max_messages=self._max_cached, expire_seconds=self._cache_expire,
                budget=self._budget,
            )
            epoch = self.epoch if not self._forgotten else new_epoch()
            self.holdings_made += 1
            state = self._subjects[subject] = SubjectState(subject, epoch, cache,
                                                           self.holdings_made)
            self._index.add(subject, state)  # (not an invalid subject)
            if not is_valid_subject(subject) and self._on_invalid_subject is not None:
                self._on_invalid_subject(subject)
        return state
