"""The invariants of a cluster run, checked against the committed log (test helper).

Pure: the committed log is the truth. Everything a member holds or a subscriber sees
must be the log's message at that position (so no position ever names two messages);
the log itself numbers each subject with no hole and keeps each publisher's order
through each member process (its origin);
each subscriber sees every message after its start exactly once, in order, and may
skip only after a DATA_RESYNC that a cache too short for it explains.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

from cluster.cache_sync import CacheSync, SubjectSync, export_sync
from cluster.coordination import UNNUMBERED_EPOCH, CommittedBatch
from migratory.model.message import Message, MessageType
from migratory.model.position import Position
from migratory.model.snapshot import merge_snapshot
from migratory.protocol import ops
from migratory.server.hub import Hub
from migratory_client.resume import SubjectTracker, Verdict

Key = tuple[str, int, int]
"""(subject, epoch, seq)"""


def message_key(m: Message) -> tuple[object, ...]:
    """What makes two copies of a message the same message."""
    return (m.subject, m.epoch, m.seq, m.content, tuple(sorted(m.fields.items())), m.retained)


def record_key(r: SubjectSync) -> tuple[object, ...]:
    snapshot = None if r.snapshot is None else message_key(r.snapshot)
    return (r.subject, r.epoch, r.seq, snapshot, tuple(message_key(m) for m in r.cached))


class CommittedLog:
    """The committed batches, checked as they are appended, with indexes to look up."""

    def __init__(self) -> None:
        self.batches: list[CommittedBatch] = []
        self.by_key: dict[Key, Message] = {}
        self.by_content: dict[bytes, Key] = {}
        self.history: dict[str, list[tuple[int, Message]]] = {}
        self.by_origin: dict[tuple[str, int], Key] = {}
        self._publisher_counters: dict[tuple[str, str, str], int] = {}

    def __len__(self) -> int:
        return len(self.batches)

    def append(self, batch: CommittedBatch) -> None:
        assert batch.clsn == len(self.batches) + 1, f"clsn {batch.clsn} after {len(self)}"
        assert len(batch.origins) == len(batch.messages)
        for message, (origin, ref) in zip(batch.messages, batch.origins, strict=True):
            self._index(batch.clsn, message, origin)
            self.by_origin[(origin, ref)] = (message.subject, message.epoch, message.seq)
        for origin, ref, epoch, seq in batch.repeats:  # a copy: the first one's position
            first = self.by_origin.get((origin, ref))
            assert first is not None and first[1:] == (epoch, seq), (
                f"repeat of {(origin, ref)} at {(epoch, seq)}: it was numbered at {first}"
            )
        self.batches.append(batch)

    def _index(self, clsn: int, m: Message, origin: str) -> None:
        key = (m.subject, m.epoch, m.seq)
        assert key not in self.by_key, f"position {key} names two messages"
        assert m.type is MessageType.UPDATE and m.closure is None, f"{key} is not a plain update"
        history = self.history.setdefault(m.subject, [])
        last = history[-1][1] if history else None
        if last is not None and last.epoch == m.epoch:
            assert m.seq == last.seq + 1, (
                f"hole in {m.subject} epoch {m.epoch}: {last.seq}->{m.seq}"
            )
        else:
            assert m.seq == 1, f"epoch {m.epoch} of {m.subject} starts at seq {m.seq}"
        publisher, counter = m.content.decode().split("#")
        if publisher != "anon":
            # Per origin: the cluster numbers each member process's publishes in the
            # order it took them. A publisher leaves its member only when that one dies,
            # and what it had published there unanswered (outcome unknown) may still
            # commit after what it publishes next through another member: a forward that
            # the dead non-seed's seed receives late (forwards_overtaken).
            through = (publisher, origin, m.subject)
            previous = self._publisher_counters.get(through, -1)
            assert counter and int(counter) > previous, f"{publisher} reordered on {m.subject}"
            self._publisher_counters[through] = int(counter)
        assert m.content not in self.by_content, f"{m.content!r} committed twice"
        self.by_key[key] = m
        self.by_content[m.content] = key
        history.append((clsn, m))

    def messages(self, subject: str, clsn: int | None = None) -> list[Message]:
        upto = len(self.batches) if clsn is None else clsn
        return [m for c, m in self.history.get(subject, ()) if c <= upto]

    def snapshot_at(self, subject: str, seq: int) -> Message | None:
        snapshot = None
        for m in self.messages(subject)[:seq]:
            snapshot = merge_snapshot(snapshot, m)
        return snapshot

    def expected_records(self, clsn: int, max_cached: int) -> dict[str, tuple[object, ...]]:
        """What a member that applied batches 1..clsn must hold, per numbered subject."""
        out = {}
        for subject in self.history:
            messages = self.messages(subject, clsn)
            if messages:
                last = messages[-1]
                snapshot = self.snapshot_at(subject, last.seq)
                cached = tuple(messages[-max_cached:]) if max_cached else ()
                record = SubjectSync(subject, last.epoch, last.seq, snapshot, cached)
                out[subject] = record_key(record)
        return out


def check_member(name: str, hub: Hub, clsn: int, log: CommittedLog, max_cached: int) -> None:
    """A member that applied batches 1..clsn holds exactly what the log says."""
    held = {r.subject: record_key(r) for r in export_sync(hub, 0).subjects}
    expected = log.expected_records(clsn, max_cached)
    assert held == expected, f"member {name} at clsn {clsn} differs from the committed log"


def check_sync_is_whole(sync: CacheSync, log: CommittedLog, max_cached: int) -> None:
    """A cache sync labelled ``clsn`` holds exactly what batches 1..clsn leave."""
    assert 0 <= sync.clsn <= len(log), f"a sync at clsn {sync.clsn} of {len(log)} committed"
    held = {r.subject: record_key(r) for r in sync.subjects}
    assert held == log.expected_records(sync.clsn, max_cached), (
        f"the sync at clsn {sync.clsn} is not what the committed log holds there"
    )


def check_publish_answers(
    message: Message, results: Sequence[ops.PublishStatus], log: CommittedLog
) -> None:
    """At most one answer; PUBLISH_OK names the committed position of this very message;
    a definite PUBLISH_FAILED ("not published") only for a message that never commits."""
    content = message.content
    assert len(results) <= 1, f"{content!r} answered {len(results)} times"
    for result in results:
        if result.status is ops.Status.PUBLISH_OK:
            assert result.position is not None
            key = (message.subject, result.position.epoch, result.position.seq)
            committed = log.by_key.get(key)
            assert committed is not None and committed.content == content, (
                f"false PUBLISH_OK for {content!r}: {key} is {committed}"
            )
            continue
        assert result.status is ops.Status.PUBLISH_FAILED, result
        reason = result.reason or ""
        if reason.startswith("not published"):
            assert content not in log.by_content, (
                f"{content!r} committed at {log.by_content[content]} after PUBLISH_FAILED"
                f" ({reason})"
            )
        else:
            assert reason.startswith("outcome unknown"), f"{content!r}: {reason}"


def resync_cause(
    position: Position | None, record: SubjectSync | None, *, snapshot: bool = False
) -> str | None:
    """Why resuming from ``position`` on a hub holding ``record`` may be a DATA_RESYNC;
    ``snapshot``: the resume asks for the snapshot as of ``position`` too (the answer to
    its first subscribe was cut before it).

    None means it must be a DATA_SYNC: the hub is not behind, its cache reaches back,
    and the snapshot asked for can be told (unchanged since ``position``, or the cache
    holds the lineage from its first message: migratory/server/hub.py
    ``_snapshot_as_of``).
    """
    if position is None:
        return None
    seen = 0 if position.epoch == UNNUMBERED_EPOCH else position.seq
    if record is None:
        return None if seen == 0 else "lagging"
    if seen and position.epoch != record.epoch:
        return "unknown epoch"
    if seen > record.seq:
        return None  # a lagging member of the same lineage waits, then DATA_SYNC
    first = record.cached[0].seq if record.cached else record.seq + 1
    if first > seen + 1:
        return "evicted"
    current = record.snapshot
    if snapshot and seen and current is not None and current.seq > seen and first != 1:
        return "snapshot gone"
    return None


@dataclass
class SubscriberView:
    """What one subscriber's application sees, through the SDK's SubjectTracker."""

    name: str
    subject: str
    tracker: SubjectTracker
    start_seq: int | None = None
    events: list[tuple[str, Message | None]] = field(default_factory=list)
    """("message", m) delivered by the tracker, or (f"resync:{cause}", None)."""
    snapshots: list[Message] = field(default_factory=list)
    expected_cause: str | None = None
    needs_resubscribe: bool = False

    def take(self, op: ops.ServerOp, cause: str | None) -> None:
        """``op`` from the hub; ``cause``: why it may be a DATA_RESYNC (None: it may not)."""
        self.expected_cause = cause
        if isinstance(op, ops.Deliver):
            for message in op.messages:
                self._take_message(message)
        elif isinstance(op, ops.SubjectStatus):
            self._take_status(op)

    def _take_message(self, m: Message) -> None:
        assert m.subject == self.subject
        verdict = self.tracker.on_message(m)
        if m.type in (MessageType.SNAPSHOT, MessageType.HISTORICAL):
            self.snapshots.append(m)
        elif verdict is Verdict.DELIVER:
            self.events.append(("message", m))
        elif verdict is Verdict.GAP:
            self.needs_resubscribe = True

    def _take_status(self, op: ops.SubjectStatus) -> None:
        self.tracker.on_status(op.status, op.position)
        if op.status is ops.Status.SUBSCRIBE_ALLOW and self.start_seq is None:
            assert op.position is not None
            self.start_seq = 0 if op.position.epoch == UNNUMBERED_EPOCH else op.position.seq
        elif op.status is ops.Status.DATA_SYNC:
            assert self.expected_cause is None, f"{self.name}: DATA_SYNC but {self.expected_cause}"
        elif op.status is ops.Status.DATA_RESYNC:
            cause = self.expected_cause
            assert cause is not None, f"{self.name}: DATA_RESYNC while the cache reaches back"
            self.events.append((f"resync:{cause}", None))


def check_subscriber(view: SubscriberView, log: CommittedLog, *, final: bool) -> None:
    """Every message after the start, once, in order; a skip only after an eviction resync."""
    assert view.start_seq is not None, f"{view.name} never got SUBSCRIBE_ALLOW"
    expected_next, may_skip = view.start_seq + 1, False
    for kind, m in view.events:
        if m is None:
            assert kind in ("resync:evicted", "resync:lagging", "resync:snapshot gone"), (
                f"{view.name}: {kind}")
            # (the snapshot gone: the current one instead of what came after the position)
            may_skip = may_skip or kind in ("resync:evicted", "resync:snapshot gone")
            continue
        key = (m.subject, m.epoch, m.seq)
        assert key in log.by_key, f"{view.name} saw {key}, which was never committed"
        assert message_key(m) == message_key(log.by_key[key]), f"{view.name}: {key} differs"
        if may_skip:
            assert m.seq >= expected_next, f"{view.name}: {key} again or out of order"
        else:
            assert m.seq == expected_next, f"{view.name}: got seq {m.seq}, wanted {expected_next}"
        expected_next, may_skip = m.seq + 1, False
    for snapshot in view.snapshots:
        expected = log.snapshot_at(view.subject, snapshot.seq)
        assert expected is not None and message_key(snapshot) == message_key(expected)
    if final and not may_skip:
        committed = len(log.messages(view.subject))
        assert expected_next - 1 == max(committed, view.start_seq), (
            f"{view.name} stopped at seq {expected_next - 1} of {committed}"
        )


def check_subscribers(views: Iterable[SubscriberView], log: CommittedLog, *, final: bool) -> None:
    for view in views:
        check_subscriber(view, log, final=final)
