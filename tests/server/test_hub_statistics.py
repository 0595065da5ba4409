"""Hub.statistics() is O(1): its subscription and cached-message counts are kept as they
change (summing over 200,000 subjects once a second stopped the event loop ~50 ms, issue
14). A random walk of every operation that changes them checks the kept counts against
a full recount after each step."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from migratory.model.message import Message
from migratory.model.position import Position
from migratory.protocol import ops
from migratory.server.format_sink import FormatSink
from migratory.server.hub import Hub

SUBJECTS = ["/a/x", "/a/y", "/b/z"]


class Sink:
    def deliver(self, frame: bytes) -> None:
        pass

    def deliver_op(self, op: ops.ServerOp) -> None:
        pass


class Listener:
    def deliver_message(self, message: Message, qos: int) -> None:
        pass

    def resync(self, subject: str, position: Position, snapshot: Message | None,
               qos: int) -> None:
        pass

    def deliver_op(self, op: ops.ServerOp) -> None:
        pass


class Stream(FormatSink):
    def deliver_formatted(self, message: Message, frames: dict[object, bytes]) -> None:
        pass

    def deliver_op(self, op: ops.ServerOp) -> None:
        pass


def recount(hub: Hub) -> tuple[int, int]:
    """What statistics() summed over every subject before it kept the counts."""
    states = hub._subjects.values()
    subscriptions = len(hub._filters) + sum(
        len(s.subscribers) + len(s.formatted) + len(s.conflated) + len(s.waiting)
        + len(s.listeners)
        for s in states
    )
    return subscriptions, sum(len(s.cache) for s in states)


step = st.tuples(
    st.sampled_from(
        ["publish", "apply", "apply_new_epoch", "subscribe", "subscribe_conflated",
         "subscribe_ahead", "unsubscribe", "listen", "unlisten", "expire", "reposition",
         "reposition_empty"]
    ),
    st.integers(0, 2),  # subject
    st.integers(0, 2),  # sink
)


@settings(max_examples=300, deadline=None)
@given(st.booleans(), st.lists(step, max_size=40))
def test_kept_counts_equal_a_recount(numbered_elsewhere: bool, steps: list[Any]) -> None:
    hub = Hub(epoch=5, max_cached_messages=3, cache_expire_seconds=2.0,
              numbered_elsewhere=numbered_elsewhere)
    sinks: list[Any] = [Sink(), Stream(), Sink()]
    listeners = [Listener(), Listener(), Listener()]
    now = 0.0
    for action, s, k in steps:
        now += 0.5
        subject, sink = SUBJECTS[s], sinks[k]
        position = hub.position(subject) or Position(5, 0)
        if action == "publish":
            hub.publish(Message(subject, b"x", retained=k == 0), now)
        elif action == "apply":
            hub.apply(Message(subject, b"x", epoch=position.epoch, seq=position.seq + 1), now)
        elif action == "apply_new_epoch":  # (from its seq 1 once it has a position: 44bef4a)
            seq = k + 1 if hub.position(subject) is None else 1
            hub.apply(Message(subject, b"x", epoch=position.epoch + 1, seq=seq), now)
        elif action == "subscribe":
            hub.subscribe(sink, ops.SubscriptionRequest(subject), now)
        elif action == "subscribe_conflated":
            hub.subscribe(sink, ops.SubscriptionRequest(subject, None, 0, 500), now)
        elif action == "subscribe_ahead":  # waits on a lagging member
            ahead = Position(position.epoch, position.seq + 2)
            hub.subscribe(sink, ops.SubscriptionRequest(subject, ahead), now)
        elif action == "unsubscribe":
            hub.unsubscribe(sink, subject)
        elif action == "listen":
            hub.listen(listeners[k], subject, k % 2)
        elif action == "unlisten":
            hub.unlisten(listeners[k], subject)
        elif action == "expire":
            hub.expire(now, budget=k + 1)
        elif action == "reposition":
            target = Position(position.epoch, position.seq + 2)
            cached = [Message(subject, b"r", epoch=target.epoch, seq=target.seq - 1),
                      Message(subject, b"r", epoch=target.epoch, seq=target.seq)]
            hub.reposition(subject, target, None, cached, now)
        else:
            hub.reposition(subject, Position(position.epoch, 0), None, [], now)
        stats = hub.statistics()
        assert (stats.subscriptions, stats.cached_messages) == recount(hub), action


class WalkCountingDict(dict[str, Any]):
    """A dict that counts the walks over it (the hub's subjects)."""

    walks = 0

    def __iter__(self) -> Iterator[str]:
        WalkCountingDict.walks += 1
        return super().__iter__()

    def values(self) -> Any:
        WalkCountingDict.walks += 1
        return super().values()

    def items(self) -> Any:
        WalkCountingDict.walks += 1
        return super().items()

    def keys(self) -> Any:
        WalkCountingDict.walks += 1
        return super().keys()


def test_statistics_walk_no_subject_whatever_their_number() -> None:
    """The counts are kept as subjects, subscriptions and caches change: a statistics
    call walks none of the 100,000 subjects (a recount took ~25 ms a call)."""
    hub = Hub(epoch=1)
    for i in range(100_000):
        hub.publish(Message(f"/one/off{i}", b"x"), now=0.0)
    hub._subjects = WalkCountingDict(hub._subjects)  # type: ignore[assignment]
    sum(1 for _ in hub._subjects.values())  # the count sees a walk
    assert WalkCountingDict.walks == 1
    for _ in range(100):
        stats = hub.statistics()
    assert WalkCountingDict.walks == 1, "statistics() walked the subjects"
    assert stats.cached_messages == 100_000 and stats.subjects == 100_000
