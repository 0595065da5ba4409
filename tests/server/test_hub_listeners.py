"""The hub's message sinks (MQTT sessions): exact and wildcard subscriptions."""

from __future__ import annotations

from typing import Any

from migratory.model.message import Message
from migratory.model.position import Position
from migratory.model.topic import FilterIndex, filter_levels
from migratory.server.hub import Hub


class Sink:
    def __init__(self) -> None:
        self.got: list[tuple[str, int, int]] = []

        self.resyncs: list[tuple[str, int, int | None, int]] = []

    def deliver_message(self, message: Message, qos: int) -> None:
        self.got.append((message.subject, message.seq, qos))

    def resync(self, subject: str, position: Position, snapshot: Message | None,
               qos: int) -> None:
        self.resyncs.append((subject, position.seq, snapshot and snapshot.seq, qos))


def test_exact_and_wildcard_listeners_get_whole_messages() -> None:
    hub = Hub(epoch=7)
    exact, wild, everything = Sink(), Sink(), Sink()
    hub.listen(exact, "/a/b", 1)
    hub.listen_filter(wild, filter_levels("a/+"), 0)
    hub.listen_filter(everything, filter_levels("#"), 1)
    hub.publish(Message("/a/b", b"1"), 0.0)
    hub.publish(Message("/a/c/d", b"2"), 0.0)
    hub.publish(Message("/$mqtt-session/00", b"{}"), 0.0)  # never matched by a wildcard
    assert exact.got == [("/a/b", 1, 1)]
    assert wild.got == [("/a/b", 1, 0)]
    assert everything.got == [("/a/b", 1, 1), ("/a/c/d", 1, 1)]
    assert hub.statistics().subscriptions == 3
    hub.unlisten(exact, "/a/b")
    hub.unlisten_filter(wild, filter_levels("a/+"))
    hub.publish(Message("/a/b", b"3"), 0.0)
    assert len(exact.got) == 1 and len(wild.got) == 1
    assert hub.statistics().subscriptions == 1


def test_missed_and_matching() -> None:
    hub = Hub(epoch=7)
    for i in range(3):
        hub.publish(Message("/x/y", b"%d" % i, retained=i == 1), 0.0)
    missed = hub.missed("/x/y", Position(7, 1))
    assert missed is not None and [m.seq for m in missed] == [2, 3]
    assert hub.missed("/x/y", Position(8, 1)) is None  # another lineage
    assert hub.missed("/never/published", Position(0, 0)) == []
    filters: FilterIndex[str] = FilterIndex()
    filters.add(filter_levels("x/#"), "x/#", 1)
    ((subject, position, snapshot, qos),) = hub.matching_any(filters).rest()
    assert (subject, position, qos) == ("/x/y", Position(7, 3), 1)
    assert snapshot is not None and snapshot.content == b"1"


def test_a_reposition_gives_listeners_what_it_jumped_over_or_the_snapshot() -> None:
    source = Hub(epoch=7)
    for i in range(5):
        source.publish(Message("/s/t", b"%d" % i, retained=True), 0.0)
    ((_, position, snapshot, run),) = list(source.numbered())
    cached = run.messages()
    behind = Hub(epoch=7)
    for i in range(2):
        behind.publish(Message("/s/t", b"%d" % i, retained=True), 0.0)
    sink = Sink()
    behind.listen(sink, "/s/t", 1)
    behind.reposition("/s/t", position, snapshot, cached, 0.0)
    assert sink.got == [("/s/t", 3, 1), ("/s/t", 4, 1), ("/s/t", 5, 1)]
    assert sink.resyncs == []
    other = Hub(epoch=9)  # another lineage: the cache cannot tell: a resync, the snapshot
    other.publish(Message("/s/t", b"x", retained=True), 0.0)
    lost = Sink()
    other.listen(lost, "/s/t", 0)
    other.reposition("/s/t", position, snapshot, cached, 0.0)
    assert lost.got == []  # (before: the snapshot as a live message, test_mqtt_resync_live)
    assert lost.resyncs == [("/s/t", 5, 5, 0)]


def test_a_reposition_gives_wildcard_listeners_what_it_jumped_over_too() -> None:
    """A subject moved forward (a cluster member's cache sync) gave the messages it jumped
    over to the sessions subscribed to it by name only: an MQTT '#' session got nothing
    of them -- a silent gap. Every matching sink now gets them, once, at the highest QoS
    of its subscriptions; a sink whose filter does not match gets nothing."""
    source = Hub(epoch=7)
    for i in range(5):
        source.publish(Message("/s/t", b"%d" % i, retained=True), 0.0)
    ((_, position, snapshot, run),) = list(source.numbered())
    behind = Hub(epoch=7)
    for i in range(2):
        behind.publish(Message("/s/t", b"%d" % i, retained=True), 0.0)
        behind.publish(Message("/u/v", b"%d" % i), 0.0)
    wild, both, elsewhere = Sink(), Sink(), Sink()
    behind.listen_filter(wild, filter_levels("s/#"), 0)
    behind.listen(both, "/s/t", 0)
    behind.listen_filter(both, filter_levels("+/t"), 1)
    behind.listen_filter(elsewhere, filter_levels("u/#"), 1)
    behind.reposition("/s/t", position, snapshot, run.messages(), 0.0)
    assert wild.got == [("/s/t", 3, 0), ("/s/t", 4, 0), ("/s/t", 5, 0)]
    assert both.got == [("/s/t", 3, 1), ("/s/t", 4, 1), ("/s/t", 5, 1)]
    assert elsewhere.got == []
    other = Hub(epoch=9)  # another lineage: the cache cannot tell: a resync, the snapshot
    other.publish(Message("/s/t", b"x", retained=True), 0.0)
    lost = Sink()
    other.listen_filter(lost, filter_levels("#"), 0)
    other.reposition("/s/t", position, snapshot, run.messages(), 0.0)
    assert lost.got == [] and lost.resyncs == [("/s/t", 5, 5, 0)]


def test_overlapping_subscriptions_deliver_once_at_the_highest_qos() -> None:
    hub = Hub(epoch=7)
    sink = Sink()
    hub.listen(sink, "/a/b", 0)
    hub.listen_filter(sink, filter_levels("a/+"), 1)
    hub.listen_filter(sink, filter_levels("#"), 0)
    hub.publish(Message("/a/b", b"1"), 0.0)
    hub.publish(Message("/a/c", b"2"), 0.0)
    assert sink.got == [("/a/b", 1, 1), ("/a/c", 1, 1)]
    assert hub.statistics().frames_fanned_out == 2


class CountingSubjects(dict):  # type: ignore[type-arg]
    """The hub's subjects, counting those a pass over all of them looks at."""

    looked = 0

    def values(self) -> Any:
        for state in super().values():
            CountingSubjects.looked += 1
            yield state


def test_a_wildcard_scan_looks_at_the_subjects_it_can_match_not_at_every_subject() -> None:
    """``a/+/c`` on a hub of 10,000 unrelated subjects: the levels under ``a`` (a pass
    over every subject stopped the server 65 ms per SUBSCRIBE at 50,000 subjects); and a
    subject the hub forgets (expiry, last unsubscribe) is no longer found."""
    hub = Hub(epoch=7, cache_expire_seconds=10)
    for i in range(10_000):
        hub.publish(Message(f"/other{i % 100}/d{i}/c", b"x", retained=True), 0.0)
    for i in range(20):
        hub.publish(Message(f"/a/d{i}/c", b"x", retained=True), 0.0)
        hub.publish(Message(f"/a/d{i}/x", b"x", retained=True), 0.0)
    hub._subjects = CountingSubjects(hub._subjects)
    CountingSubjects.looked = 0
    filters: FilterIndex[str] = FilterIndex()
    filters.add(filter_levels("a/+/c"), "a/+/c", 0)
    visited = getattr(hub, "subjects_visited", 0)
    found = hub.matching_any(filters, retained=True).rest()
    assert sorted(s for s, _, _, _ in found) == sorted(f"/a/d{i}/c" for i in range(20))
    looked = CountingSubjects.looked + getattr(hub, "subjects_visited", 0) - visited
    assert looked <= 3 * 40 + 10  # O(what lies under /a): not 10,040
    sink = Sink()
    hub.listen(sink, "/a/only/c", 0)  # no message: forgotten at the last unlisten
    hub.unlisten(sink, "/a/only/c")
    hub.expire(20.0)  # no cache left, no snapshot lost: the retained subjects stay
    hub.publish(Message("/a/spent/c", b"x"), 20.0)  # no snapshot: spent once expired
    hub.expire(40.0)
    assert "/a/spent/c" not in hub._subjects
    found = hub.matching_any(filters).rest()
    assert sorted(s for s, _, _, _ in found) == sorted(f"/a/d{i}/c" for i in range(20))
