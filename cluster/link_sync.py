"""A cache sync too large for one link frame, sent as several (sans-I/O).

A whole cache sync (:mod:`cluster.cache_sync`) is every cached message a member holds.
With the default ``CacheMemoryBudget`` (256 MiB) that is ~680,000 messages of 100 bytes:
one 84 MB frame, above :data:`~cluster.link_ops.MAX_FRAME` (64 MiB). The encoder
refused it, so a member joining a busy cluster (or a seed that found a gap) never got
its sync and never became ready, and the member it asked tried again and again.

:func:`sync_frames` sends a sync that fits a part (:data:`PART_SHARE`) as the one ``Sync``
frame it always was (what an older member understands), and a larger one as
``SyncPart`` frames of about that size; a subject whose cached messages do not fit one
part goes on in the next. The frames are queued together, so no other operation comes
between them. :class:`SyncAssembly` (run by :class:`~cluster.link.LinkConnection`)
puts the parts back together, refusing parts that do not fit together, and the
connection yields one ``Sync``: the members taking it are unchanged.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import Final

from cluster import link_ops
from cluster.cache_sync import CacheSync, SubjectSync, SyncCapture
from cluster.link_ops import LinkError, Sync, SyncPart, encode_frame
from migratory.model.cache import encoded_bound
from migratory.model.message import Message

__all__ = ["PART_SHARE", "SyncAssembly", "SyncFrames", "iter_parts", "sync_frames", "sync_parts"]

PART_SHARE: Final = 64
"""A sync part is about MAX_FRAME / PART_SHARE (1 MiB, ~20 ms of the event loop to
build)."""
_ITEM_BYTES: Final = 48
"""A message's or a subject record's CBOR framing, epoch, seq and flags, at most."""


def message_bytes(message: Message) -> int:
    """About what ``message`` takes in a frame: what a cache counts for it, and its
    item's framing."""
    return encoded_bound(message) + _ITEM_BYTES


def _head_bytes(record: SubjectSync, with_snapshot: bool) -> int:
    size = len(record.subject) + _ITEM_BYTES
    if with_snapshot and record.snapshot is not None:
        size += message_bytes(record.snapshot)
    return size


def sync_parts(sync: CacheSync, part_bytes: int) -> list[SyncPart]:
    """``sync`` as parts of about ``part_bytes`` each (:func:`iter_parts`)."""
    return list(iter_parts(sync.clsn, sync.subjects, part_bytes))


def iter_parts(
    clsn: int, records: Iterable[SubjectSync], part_bytes: int
) -> Iterator[SyncPart]:
    """The sync of ``records`` at ``clsn`` as parts of about ``part_bytes`` each (a
    message larger than that alone in its part), the last one marked; each subject in
    order, its snapshot in its first piece. Lazy: a record is read when its part is."""
    current: list[SubjectSync] = []
    size = 0
    for record in records:
        cached, first, start = record.cached, True, 0
        piece = _head_bytes(record, True)
        if current and size + piece > part_bytes:
            yield SyncPart(clsn, tuple(current), False)
            current, size = [], 0
        for i, message in enumerate(cached):
            more = message_bytes(message)
            if size + piece + more > part_bytes and (current or i > start):
                if i > start:
                    current.append(_piece(record, first, cached[start:i]))
                    first, start = False, i
                    piece = _head_bytes(record, False)
                yield SyncPart(clsn, tuple(current), False)
                current, size = [], 0
            piece += more
        current.append(_piece(record, first, cached[start:]))
        size += piece
    yield SyncPart(clsn, tuple(current), True)


def _piece(record: SubjectSync, first: bool, cached: tuple[Message, ...]) -> SubjectSync:
    snapshot = record.snapshot if first else None
    return SubjectSync(record.subject, record.epoch, record.seq, snapshot, cached)


def sync_frames(sync: CacheSync, part_bytes: int | None = None) -> list[bytes]:
    """The frames of ``sync``: one ``Sync`` when it fits one part (by default
    MAX_FRAME / PART_SHARE), else its parts. Queue them together: nothing may come
    between them on the link."""
    return list(_frames(sync.clsn, sync.subjects, part_bytes))


def _frames(
    clsn: int, records: Iterable[SubjectSync], part_bytes: int | None
) -> Iterator[bytes]:
    if part_bytes is None:
        part_bytes = link_ops.MAX_FRAME // PART_SHARE
    parts = iter_parts(clsn, records, part_bytes)
    first = next(parts)
    if first.last:  # the one frame an older member reads
        yield encode_frame(Sync(CacheSync(clsn, first.subjects)))
        return
    yield encode_frame(first)
    for part in parts:
        yield encode_frame(part)


class SyncFrames:
    """A cache sync to write to one follower, built a part at a time as it is written
    (:meth:`frames`): rebuilding and encoding 680,000 cached messages at once stopped
    the member's event loop for seconds. Queued as one item, so no other frame comes
    between its parts."""

    __slots__ = ("capture", "part_bytes")

    def __init__(self, capture: SyncCapture, part_bytes: int | None = None) -> None:
        self.capture = capture
        self.part_bytes = part_bytes

    @property
    def clsn(self) -> int:
        return self.capture.clsn

    def frames(self) -> Iterator[bytes]:
        return _frames(self.capture.clsn, self.capture.subjects(), self.part_bytes)


class SyncAssembly:
    """The parts of one cache sync, put together (:func:`sync_parts` undone). A subject
    whole in one part keeps the record decoded from it (copying every subject's messages
    into a new record when the last part came stopped the event loop ~60 ms for
    500,000 messages); only one that goes on in the next part is joined."""

    def __init__(self) -> None:
        self._clsn: int | None = None
        self._records: list[SubjectSync] = []
        self._more: list[Message] = []
        """Cached messages of the last record that came in later parts."""
        self._subjects: set[str] = set()

    def _reset(self) -> None:
        self._clsn, self._records, self._more, self._subjects = None, [], [], set()

    @property
    def open(self) -> bool:
        """A part has come and the last one has not."""
        return self._clsn is not None

    def add(self, part: SyncPart) -> CacheSync | None:
        """Take ``part``; the whole sync when it is the last. :class:`LinkError` for a
        part that does not go on from the ones before."""
        if self._clsn is None:
            self._clsn = part.clsn
        elif part.clsn != self._clsn:
            raise LinkError(
                f"cache sync part at clsn {part.clsn} within a sync at clsn {self._clsn}"
            )
        for record in part.subjects:
            self._take(record)
        if not part.last:
            return None
        self._join_more()
        sync = CacheSync(self._clsn, tuple(self._records))
        self._reset()
        return sync

    def _take(self, record: SubjectSync) -> None:
        records = self._records
        if records and records[-1].subject == record.subject:
            head = records[-1]
            if (record.epoch, record.seq) != (head.epoch, head.seq) or record.snapshot is not None:
                raise LinkError(
                    f"cache sync part: {record.subject!r} goes on with another position "
                    "or a second snapshot"
                )
            self._more.extend(record.cached)
            return
        if record.subject in self._subjects:
            raise LinkError(f"cache sync part: {record.subject!r} comes twice")
        self._join_more()
        self._subjects.add(record.subject)
        records.append(record)

    def _join_more(self) -> None:
        """The last record with the cached messages that came after it."""
        if self._more:
            head = self._records[-1]
            cached = (*head.cached, *self._more)
            self._records[-1] = SubjectSync(head.subject, head.epoch, head.seq, head.snapshot,
                                            cached)
            self._more = []
