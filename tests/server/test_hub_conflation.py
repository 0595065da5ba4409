"""The hub's conflated subscriptions of one subject merge each message's fields once
(migratory/model/field_timeline.py), and let a subscription's union go with it."""

from __future__ import annotations

import sys
from types import FrameType

from test_hub import RecordingSink

from migratory.model.message import Message
from migratory.protocol import ops
from migratory.server.hub import Hub

SUBJECT = "/Stocks/NYSE/IBM"


def text_sizes_measured(action: object) -> int:
    """Calls of a function named ``_text_size`` (the UTF-8 size of a field's name or
    value, wherever it is defined) while ``action()`` runs."""
    calls = [0]

    def profile(frame: FrameType, event: str, _arg: object) -> None:
        if event == "call" and frame.f_code.co_name == "_text_size":
            calls[0] += 1

    sys.setprofile(profile)
    try:
        action()  # type: ignore[operator]
    finally:
        sys.setprofile(None)
    return calls[0]


def test_a_publish_merges_its_fields_once_whatever_the_conflated_subscribers() -> None:
    """200 conflated subscribers, a publish of 1,000 fields: each subscription merged
    them into a dict of its own, measuring 400,200 field texts (at 20,000 fields, 2.6 s
    of the event loop per publish, no other client served; docs/benchmarks.md). Now
    about 2,000: the subject's timeline measures each once."""
    hub = Hub(epoch=1, max_message_size=131072)
    sinks = [RecordingSink() for _ in range(200)]
    for i, sink in enumerate(sinks):
        hub.subscribe(sink, ops.SubscriptionRequest(SUBJECT, conflation_ms=100 * (1 + i % 50)),
                      0.0)
    fields = {f"f{i}": "v" for i in range(1000)}
    for seq in range(1, 4):
        measured = text_sizes_measured(
            lambda seq=seq: hub.publish(Message(SUBJECT, b"x", fields), 0.01 * seq))
        assert measured <= 3 * len(fields)
    hub.tick(10.0)
    for sink in sinks:
        (merged,) = sink.messages()
        assert dict(merged.fields) == fields and merged.seq == 3


def test_an_unsubscribed_conflator_lets_its_union_go() -> None:
    hub = Hub(epoch=1, max_message_size=131072)
    stays, leaves = RecordingSink(), RecordingSink()
    hub.subscribe(stays, ops.SubscriptionRequest(SUBJECT, conflation_ms=100), 0.0)
    hub.subscribe(leaves, ops.SubscriptionRequest(SUBJECT, conflation_ms=3_600_000), 0.0)
    hub.publish(Message(SUBJECT, b"1", {"a": "1"}), 0.05)
    hub.unsubscribe(leaves, SUBJECT)
    hub.tick(0.1)
    (merged,) = stays.messages()
    assert dict(merged.fields) == {"a": "1"}
    (conflator,) = hub._subjects[SUBJECT].conflated.values()
    assert conflator.timeline.held == 0


def test_subscribers_due_at_one_tick_with_one_union_share_its_frame() -> None:
    """A conflated message was built and encoded for each subscriber: 200 encodings of
    one union of 1,000 fields every period. Subscribers due at the same tick with the
    same union (the same period, subscribed at the same moment) now get one frame; one
    subscribed later, whose union started later, gets its own."""
    hub = Hub(epoch=1, max_message_size=131072)
    sinks = [RecordingSink() for _ in range(200)]
    for sink in sinks:
        hub.subscribe(sink, ops.SubscriptionRequest(SUBJECT, conflation_ms=500), 0.0)
    hub.publish(Message(SUBJECT, b"1", {f"f{i}": "v" for i in range(1000)}), 0.1)
    late = RecordingSink()
    hub.subscribe(late, ops.SubscriptionRequest(SUBJECT, conflation_ms=500), 0.2)
    hub.publish(Message(SUBJECT, b"2", {"f0": "w"}), 0.3)
    hub.tick(0.5)
    assert len({id(frame) for sink in sinks for frame in sink.frames}) == 1
    (merged,) = sinks[0].messages()
    assert len(merged.fields) == 1000 and merged.fields["f0"] == "w"
    hub.tick(0.7)
    (own,) = late.messages()
    assert dict(own.fields) == {"f0": "w"} and own.content == b"2"
