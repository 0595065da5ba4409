"""Conflation: one merged message per subject per period of a subscription."""

from dataclasses import replace

from migratory.model.message import Message, MessageType

__all__ = ["CONFLATION_STEP_MS", "Conflator", "round_conflation_ms"]

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
    """

    __slots__ = ("_fields", "_fields_size", "_latest", "_max_size", "_period", "_periods",
                 "_start")

    def __init__(self, *, period_ms: int, start: float, max_size: int = 0) -> None:
        if period_ms <= 0:
            raise ValueError(f"period_ms must be > 0, got {period_ms}")
        self._period = period_ms / 1000
        self._start = start
        self._periods = 1
        self._latest: Message | None = None
        self._fields: dict[str, str] = {}
        self._fields_size = 0  # UTF-8 bytes of the names and values in _fields
        self._max_size = max_size

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
        return self._latest is not None

    def offer(self, message: Message, now: float | None = None) -> None:
        """Aggregate ``message`` into the current period. ``now``: a conflator nobody
        polls while it has nothing pending (the hub's) first moves its deadline past
        ``now``, as polling would have, so what it emits stays one per period."""
        latest = self._latest
        if latest is not None and latest.subject != message.subject:
            raise ValueError(
                f"conflator of {latest.subject!r} cannot take a message of {message.subject!r}"
            )
        if latest is None and now is not None and now >= self.next_deadline:
            self._move_past(now)
        self._latest = message
        fields = message.fields
        if not fields:
            return
        if not self._max_size:
            self._fields.update(fields)
            return
        merged = self._fields
        size = self._fields_size
        for name, value in fields.items():
            old = merged.get(name)
            if old is None:
                size += _text_size(name) + _text_size(value)
            else:
                size += _text_size(value) - _text_size(old)
        if size + len(message.content) + _text_size(message.subject) > self._max_size:
            merged = self._fields = dict(fields)
            size = sum(_text_size(n) + _text_size(v) for n, v in fields.items())
        else:
            merged.update(fields)
        self._fields_size = size

    def poll(self, now: float) -> Message | None:
        """At or after the deadline: move it past ``now`` and return the aggregate, if any."""
        if now < self.next_deadline:
            return None
        self._move_past(now)
        latest = self._latest
        if latest is None:
            return None
        conflated = replace(latest, fields=self._fields, type=MessageType.UPDATE)
        self._latest = None
        self._fields = {}
        self._fields_size = 0
        return conflated

    def _move_past(self, now: float) -> None:
        periods = max(self._periods, int((now - self._start) // self._period))
        while self._start + periods * self._period <= now:
            periods += 1
        self._periods = periods


def _text_size(text: str) -> int:
    return len(text) if text.isascii() else len(text.encode("utf-8", "surrogatepass"))
