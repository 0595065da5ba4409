"""How many bytes a subscribe's answer can take, known before it is made: a session
checks it first (bound, then work), and refuses an answer past the client's pending
limit with "subscribe answer too large"."""

from __future__ import annotations

from migratory.model.cache import encoded_bound
from migratory.model.position import Position
from migratory.protocol import ops
from migratory.server.subject_state import SubjectState

MESSAGE_OVERHEAD = 96
"""Bytes a delivered message adds to its ``encoded_bound`` on the wire, at most (its CBOR
keys, epoch, seq, type and the frame header), for the answer-size bound."""


def answer_bytes(
    state: SubjectState | None,
    request: ops.SubscriptionRequest,
    *,
    unnumbered: Position,
    publish_snapshot: bool,
) -> int:
    """An upper bound, in O(1), of the bytes of the messages the hub answers ``request``
    with, for the subject's ``state`` (None: not known). ``unnumbered``: the hub's
    "saw nothing" position (its epoch, seq 0)."""
    if state is None:
        return 0
    snapshot = 0 if state.snapshot is None else encoded_bound(state.snapshot) + MESSAGE_OVERHEAD
    position = request.position
    cache = state.cache
    if position is None:
        if request.history > 0:
            count = min(request.history, len(cache))
            return cache.bytes_of_newest(count) + count * MESSAGE_OVERHEAD
        return snapshot if publish_snapshot else 0
    if position.epoch == state.epoch and state.seq - position.seq >= 0:
        # (with a history as of ``position``: as many older messages too)
        count = min(state.seq - position.seq + max(request.history, 0), len(cache))
        recovered = cache.bytes_of_newest(count) + count * MESSAGE_OVERHEAD
        # asked with the snapshot: it comes before the messages recovered
        return snapshot + recovered if request.snapshot else max(snapshot, recovered)
    if position == unnumbered:  # saw nothing: all of it is missed (Hub._missed)
        recovered = cache.bytes + len(cache) * MESSAGE_OVERHEAD
        return snapshot + recovered if request.snapshot else max(snapshot, recovered)
    # ahead of this hub (a lagging member: nothing now) or an epoch the subject no
    # longer has: the snapshot and DATA_RESYNC (sizing it as the whole cache refused
    # resumes whose answer is one message: "subscribe answer too large")
    return snapshot
