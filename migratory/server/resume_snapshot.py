"""The snapshot a resume owes when it asks for it (``snapshot: true``: the answer to
the client's first subscribe was cut after its SUBSCRIBE_ALLOW, before the snapshot;
docs/protocol.md, "What a subscribe produces")."""

from __future__ import annotations

from migratory.model.message import Message
from migratory.model.position import Position
from migratory.model.snapshot import merge_snapshot
from migratory.server.subject_state import SubjectState

GONE = object()
"""The snapshot a resume asked for can no longer be told (:func:`snapshot_as_of`)."""


def snapshot_as_of(
    state: SubjectState, position: Position, *, publish_snapshot: bool
) -> Message | object | None:
    """The snapshot a resume from ``position`` is owed: None when there is none
    (snapshots not published; seq 0: the messages recovered carry the whole snapshot; no
    retained message at or before ``position``), :data:`GONE` when it cannot be told (it
    changed after ``position`` -- its fields merged over -- and the cache no longer
    holds the lineage from its first message: the current one and ``DATA_RESYNC``
    then)."""
    current = state.snapshot
    if not publish_snapshot or current is None:
        return None
    if current.epoch != position.epoch or current.seq <= position.seq:
        return current  # (unchanged since, or the resume is of another lineage)
    if position.seq == 0:
        return None
    if state.cache.first_seq != 1:
        return GONE
    # the whole lineage is cached: the snapshot as of ``position`` is rebuilt from it
    # (None if nothing retained came before: a subject without a snapshot when the
    # client's answer was cut; was DATA_RESYNC, the machine of tests/cluster found it)
    owed: Message | None = None
    for message in state.cache.since(0) or ():
        if message.seq > position.seq:
            break
        owed = merge_snapshot(owed, message)
    return owed
