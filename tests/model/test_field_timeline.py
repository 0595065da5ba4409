"""Conflators sharing one subject's FieldTimeline (migratory/model/field_timeline.py): they
emit what a conflator merging every message into its own dict emits (the rule of
migratory/model/conflation.py, kept here as the model), and a message's fields are
merged once for all of them."""

from __future__ import annotations

from dataclasses import dataclass, field

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from migratory.model import field_timeline
from migratory.model.conflation import Conflator, offer_to
from migratory.model.field_timeline import PRUNE_SLACK, FieldTimeline
from migratory.model.message import Message, MessageType

SUBJECT = "/s/x"


def size_of(text: str) -> int:
    return len(text.encode("utf-8", "surrogatepass"))


@dataclass
class Model:
    """One subscription's union as a dict of its own (what each conflator did before)."""

    max_size: int
    latest: Message | None = None
    fields: dict[str, str] = field(default_factory=dict)

    def offer(self, message: Message) -> None:
        pending = self.latest is not None
        self.latest = message
        if not message.fields:
            return
        merged = {**self.fields, **message.fields} if pending else dict(message.fields)
        size = sum(size_of(n) + size_of(v) for n, v in merged.items())
        extra = len(message.content) + size_of(message.subject)
        if self.max_size and size + extra > self.max_size:
            merged = dict(message.fields)
        self.fields = merged

    def emit(self) -> Message | None:
        if self.latest is None:
            return None
        emitted = Message(self.latest.subject, self.latest.content, self.fields,
                          seq=self.latest.seq, type=MessageType.UPDATE)
        self.latest, self.fields = None, {}
        return emitted


names = st.sampled_from(["a", "b", "cc", "dé", "eee", "f"])
values = st.sampled_from(["", "1", "22", "333", "ü4"])
messages = st.tuples(st.binary(max_size=6), st.dictionaries(names, values, max_size=4))
steps = st.lists(
    st.one_of(
        st.tuples(st.just("publish"), messages),
        st.tuples(st.just("publish"), messages),
        st.tuples(st.just("subscribe"), st.sampled_from([1, 2, 10])),
        st.tuples(st.just("unsubscribe"), st.integers(0, 5)),
        st.tuples(st.just("tick"), st.just(0)),
    ),
    max_size=80,
)


LONG_AND_SHORT = [("subscribe", 10), ("subscribe", 1), ("publish", (b"", {"a": "1"})),
                  ("tick", 0), ("publish", (b"1", {"b": "22", "a": "3"})), ("tick", 0)] * 6
"""A long period held while a short one emits: released starts pile up (compacted)."""


@settings(max_examples=400, deadline=None)
@example(max_size=20, steps=LONG_AND_SHORT, slack=1)
@given(max_size=st.sampled_from([0, 10, 14, 20, 30]), steps=steps, slack=st.sampled_from([1, 2]))
def test_shared_conflators_emit_what_each_merging_alone_emits(
    max_size: int, steps: list[tuple[str, object]], slack: int
) -> None:
    """With a slack of 1 or 2 (1,024 in the server), the clean-ups -- dead fields pruned,
    released starts compacted -- happen all the time."""
    kept = field_timeline.PRUNE_SLACK
    field_timeline.PRUNE_SLACK = slack
    try:
        emit_as_the_model(max_size, steps)
    finally:
        field_timeline.PRUNE_SLACK = kept


def emit_as_the_model(max_size: int, steps: list[tuple[str, object]]) -> None:
    conflators: list[tuple[Conflator, Model]] = []
    now, seq = 0.0, 0
    for kind, arg in steps:
        now += 0.1
        if kind == "publish":
            content, fields = arg  # type: ignore[misc]
            seq += 1
            message = Message(SUBJECT, content, fields, seq=seq)
            offer_to([c for c, _ in conflators], message, now)
            for _, model in conflators:
                model.offer(message)
        elif kind == "subscribe":
            shared = conflators[0][0].timeline if conflators else None
            conflator = Conflator(period_ms=100 * arg, start=now,  # type: ignore[operator]
                                  max_size=max_size, timeline=shared)
            conflators.append((conflator, Model(max_size)))
        elif kind == "unsubscribe" and conflators:
            conflator, _ = conflators.pop(arg % len(conflators))  # type: ignore[operator]
            conflator.release()
        for conflator, model in conflators:
            if conflator._union is not None:  # the size its checks compare
                assert conflator.timeline.union_size(conflator._union) == sum(
                    size_of(n) + size_of(v) for n, v in model.fields.items())
            if now >= conflator.next_deadline:
                assert conflator.poll(now) == model.emit()
        if conflators:
            timeline = conflators[0][0].timeline
            assert timeline.held == sum(c.has_pending for c, _ in conflators)


def test_a_message_s_fields_are_merged_once_for_every_conflator(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """200 conflated subscriptions of a subject and a publish of 1,000 fields: each
    subscription merged all of them into a dict of its own, 200,000 field sizes measured
    (2.6 s of the event loop at 20,000 fields; docs/benchmarks.md). Now 1,000."""
    measured: list[str] = []
    size = field_timeline._text_size

    def counted(text: str) -> int:
        measured.append(text)
        return size(text)

    monkeypatch.setattr(field_timeline, "_text_size", counted)
    timeline = FieldTimeline()
    conflators = [Conflator(period_ms=100 * (1 + i % 50), start=0.0, max_size=131072,
                            timeline=timeline) for i in range(200)]
    fields = {f"f{i}": "v" for i in range(1000)}
    for seq in range(1, 4):
        measured.clear()
        offer_to(conflators, Message(SUBJECT, b"x", fields, seq=seq), 0.01 * seq)
        assert len(measured) <= 2 * len(fields) + 1  # names, values, the subject
    emitted = [c.poll(10.0) for c in conflators]
    assert all(m is not None and dict(m.fields) == fields for m in emitted)


def test_fields_no_union_needs_are_let_go() -> None:
    """A long-period subscription holds its union while short ones emit and new field
    names keep coming: the timeline keeps what the held unions need, and slack."""
    timeline = FieldTimeline()
    slow = Conflator(period_ms=3_600_000, start=0.0, max_size=2000, timeline=timeline)
    fast = Conflator(period_ms=100, start=0.0, max_size=2000, timeline=timeline)
    for seq in range(1, 5001):
        now = seq * 0.05
        offer_to([slow, fast], Message(SUBJECT, b"", {f"n{seq}": "v"}, seq=seq), now)
        fast.poll(now)
        assert timeline.field_count <= 2 * 2000 + PRUNE_SLACK
    union = slow.poll(3600.0)
    assert union is not None and len(union.fields) < 2000 // 6 + 1  # within MaxMessageSize
    assert union.fields[f"n{5000}"] == "v"
    fast.release()
    assert timeline.held == 0


def test_a_timeline_nobody_waits_on_holds_no_message() -> None:
    """Once every subscription emitted, the subject's latest message (up to
    MaxMessageSize, kept alive past the cache's budget) and its fields are let go."""
    timeline = FieldTimeline()
    a = Conflator(period_ms=100, start=0.0, max_size=1000, timeline=timeline)
    b = Conflator(period_ms=200, start=0.0, max_size=1000, timeline=timeline)
    offer_to([a, b], Message(SUBJECT, b"x" * 500, {"k": "v"}, seq=1), 0.05)
    assert a.poll(0.1) is not None and timeline.latest is not None  # b still waits
    emitted = b.poll(0.2)
    assert emitted is not None and dict(emitted.fields) == {"k": "v"}
    assert timeline.latest is None and timeline.field_count == 0
    offer_to([a, b], Message(SUBJECT, b"y", {"j": "w"}, seq=2), 0.25)
    assert dict(a.poll(0.35).fields) == {"j": "w"}  # type: ignore[union-attr]
