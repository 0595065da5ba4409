"""Conflation: one merged message per subject per period of a subscription."""

from collections.abc import Collection, Sequence
from dataclasses import replace

from migratory.model.field_timeline import FieldTimeline
from migratory.model.message import Message

__all__ = ["CONFLATION_STEP_MS", "Conflator", "fold", "offer_run_to", "offer_to",
           "round_conflation_ms"]

CONFLATION_STEP_MS = 100
"""Conflation periods are multiples of this many milliseconds."""


def round_conflation_ms(ms: int) -> int:
    """Round a requested conflation time down to a multiple of 100 ms (seed: 78 → 0, 547 → 500).

    0 means no conflation. Negative times raise ValueError.
    """
    if ms < 0:
        raise ValueError(f"conflation time must be >= 0 ms, got {ms}")
    return ms - ms % CONFLATION_STEP_MS


class Conflator:
    """Aggregates one subject's messages for one subscription and emits one per period.

    Deadlines fall at ``start + k * period`` (k = 1, 2, ...); times are seconds on the
    caller's clock. The emitted message is the latest one offered, with the union of the
    fields of the messages offered during that period (later values win) and type UPDATE.

    ``max_size`` (MaxMessageSize; 0: none) bounds the emitted message as a publish is
    bounded: when a message's fields would make the union pass it, the fields gathered so
    far give way to that message's own. A publisher sending new field names for a period
    (up to an hour) made every conflated subscriber hold each of them.

    The fields are merged in a :class:`FieldTimeline` shared by every conflator of the
    subject (``timeline``; one of its own by default): a message is offered to it once
    (:func:`offer_to`), and each conflator keeps only where its union starts.
    """

    __slots__ = ("_max_size", "_period", "_periods", "_start", "_union", "timeline")

    def __init__(self, *, period_ms: int, start: float, max_size: int = 0,
                 timeline: FieldTimeline | None = None) -> None:
        if period_ms <= 0:
            raise ValueError(f"period_ms must be > 0, got {period_ms}")
        self._period = period_ms / 1000
        self._start = start
        self._periods = 1
        self._union: int | None = None  # where the pending union starts in the timeline
        self._max_size = max_size
        self.timeline = FieldTimeline() if timeline is None else timeline

    @property
    def period(self) -> float:
        """The conflation period in seconds."""
        return self._period

    @property
    def next_deadline(self) -> float:
        """When ``poll`` next emits."""
        return self._start + self._periods * self._period

    @property
    def has_pending(self) -> bool:
        """Whether a message was offered since the last emission."""
        return self._union is not None

    def offer(self, message: Message, now: float | None = None) -> None:
        """Aggregate ``message`` into the current period (a conflator with a timeline of
        its own; conflators sharing one take a message through :func:`offer_to`). ``now``:
        a conflator nobody polls while it has nothing pending (the hub's) first moves its
        deadline past ``now``, as polling would have, so what it emits stays one per
        period."""
        self.timeline.offer(message)
        self.offered(now)

    def offered(self, now: float | None = None) -> None:
        """The timeline took a message: it joins this conflator's period."""
        union = self._union
        timeline = self.timeline
        if union is None:
            if now is not None and now >= self.next_deadline:
                self._move_past(now)
            self._union = timeline.hold()
        elif self._max_size and timeline.latest_has_fields and timeline.passes(
            union, self._max_size
        ):
            timeline.release(union)
            self._union = timeline.hold()

    def poll(self, now: float) -> Message | None:
        """At or after the deadline: move it past ``now`` and return the aggregate, if any."""
        if now < self.next_deadline:
            return None
        self._move_past(now)
        union = self._union
        if union is None:
            return None
        timeline = self.timeline
        conflated = timeline.emitted(union)
        self._union = None
        timeline.release(union)
        timeline.idle()  # (the last one pending: its message is let go)
        return conflated

    def release(self) -> None:
        """The subscription is gone: its pending union too."""
        if self._union is not None:
            self.timeline.release(self._union)
            self._union = None

    def _move_past(self, now: float) -> None:
        periods = max(self._periods, int((now - self._start) // self._period))
        while self._start + periods * self._period <= now:
            periods += 1
        self._periods = periods


def offer_to(conflators: Collection[Conflator], message: Message, now: float) -> None:
    """Offer ``message`` to ``conflators``, which share one timeline: merged once."""
    if not conflators:
        return
    first = next(iter(conflators))
    first.timeline.offer(message)
    for conflator in conflators:
        conflator.offered(now)


def fold(messages: Sequence[Message]) -> Message:
    """The seed's conflation of ``messages`` (oldest first, at least one): the latest, with
    the union of their fields, later values winning -- each field where the last message
    that set it put it, as a :class:`FieldTimeline` orders them (so the fields a union
    emits come in the same order either way)."""
    if len(messages) == 1:
        return messages[0]
    fields: dict[str, str] = {}
    for message in messages:
        for name, value in message.fields.items():
            fields.pop(name, None)
            fields[name] = value
    latest = messages[-1]
    return replace(latest, fields=fields) if fields else latest


def offer_run_to(conflators: Collection[Conflator], messages: Sequence[Message],
                 now: float) -> None:
    """Offer ``messages`` (oldest first: a cache sync's jump, ``Hub._catch_up_live``) to
    ``conflators``, which share one timeline: what :func:`offer_to` of each in turn does.

    A conflator keeps one merge a period, the latest message with the union of the
    fields: that of the run is its :func:`fold`, so the run is offered once, folded --
    one ``offered`` per conflator, not one per message (10,000 conflated subscriptions
    and a jump of 400: 4,000,000). Unless a union could pass a conflator's ``max_size``
    along the run (:meth:`FieldTimeline.size_along`): one message at a time starts it
    again from the message that passes, which the fold cannot tell -- then one at a time."""
    if not conflators or not messages:
        return
    bounds = [c._max_size for c in conflators if c._max_size]
    first = next(iter(conflators))
    if not bounds or first.timeline.size_along(messages) <= min(bounds):
        offer_to(conflators, fold(messages), now)
        return
    for message in messages:
        offer_to(conflators, message, now)
