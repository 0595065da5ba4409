"""Snapshot messages: the latest retained message with earlier fields merged in."""

from collections.abc import Mapping
from dataclasses import replace

from migratory.model.message import Message, MessageType
from migratory.model.subject import RESERVED_PREFIX

__all__ = ["GENERATION_FIELD", "RESERVED_PREFIX", "WRITER_FIELD", "generation_key",
           "merge_snapshot", "merged_size"]

GENERATION_FIELD = "generation"
"""On a :data:`RESERVED_PREFIX` subject, the field that orders a record's writers (the
connections of an MQTT persistent session, ``migratory/server/mqtt_store.py``): a retained
message of a lower generation than the snapshot's is the late write of a writer already
replaced, and leaves the snapshot as it is. Each writer checks before it writes, but
against its own member's (or worker's) snapshot: a connection that ended on one worker
just as its client's clean CONNECT discarded the session on another saved with the
older generation, the save was numbered after the discard, and brought the discarded
session back, filters and all (6 of 80 by hand, with Workers = 2). Decided here, as the
stream is applied -- in the same order on every member and worker -- it holds on each."""

WRITER_FIELD = "writer"
"""Beside :data:`GENERATION_FIELD`: the writer of a record of that generation (one
connection, or one discard). Generations are ordered by ``(generation, writer)``: two
writers that read the same stored record -- two CONNECTs of one client id on two workers
or members at once -- both write the next generation, and the lower writer's record is
the older, whichever is applied first (before, the later merged over the earlier: a
discard and a resumed session's save of one generation undid each other in the order
they happened to be numbered). The same writer's saves merge; a record with no writer
(an earlier version's, 524f73f's) is the lowest of its generation, and the snapshot it
makes names no writer: the same version's later saves of that generation merge (with
the writer before it kept, they ranked below it and were dropped)."""

def merge_snapshot(previous: Message | None, incoming: Message) -> Message | None:
    """The subject's snapshot after ``incoming``, given its snapshot ``previous``.

    Only retained messages take part: a non-retained ``incoming`` returns ``previous``
    unchanged. Otherwise the result is ``incoming`` (content, position, qos, retained)
    with ``previous``'s fields updated by its own, type SNAPSHOT and no closure; on a
    :data:`RESERVED_PREFIX` subject an empty field of ``incoming`` removes the field.
    Raises ValueError when the two messages have different subjects.

    The one rule of a subject's snapshot: the hub and the seeds' replicated cache
    (``cluster/replicated_cache.py``: a Raft dump, a cache sync) apply nothing else. A new
    epoch (lineage) of the subject changes nothing here: the seeds' table merges the
    fields of every earlier message, and an epoch is internal -- a Standard resync
    carries the snapshot into its new lineage too (``tests/cluster/
    test_snapshot_one_rule.py``; before, the replicated cache dropped it there).
    """
    if previous is not None and previous.subject != incoming.subject:
        raise ValueError(
            f"snapshot of {previous.subject!r} cannot merge a message of {incoming.subject!r}"
        )
    if not incoming.retained:
        return previous
    reserved = incoming.subject.startswith(RESERVED_PREFIX)
    if reserved and previous is not None and _older_generation(previous, incoming):
        return previous
    if previous is None or not previous.fields:
        fields = dict(incoming.fields)
    else:
        fields = dict(previous.fields)
        fields.update(incoming.fields)
    if reserved:
        for name, value in incoming.fields.items():
            if not value:
                del fields[name]
        if WRITER_FIELD not in incoming.fields and GENERATION_FIELD in incoming.fields:
            fields.pop(WRITER_FIELD, None)  # an earlier version's record: its generation's
            # writer names none (kept, the earlier writer outranked its every later save)
    return replace(incoming, fields=fields, type=MessageType.SNAPSHOT, closure=None)


def _older_generation(previous: Message, incoming: Message) -> bool:
    """``incoming`` names a lower generation than ``previous`` (:func:`generation_key`;
    both must name one: a record of an earlier version names none, and is merged)."""
    theirs = generation_key(previous.fields)
    mine = generation_key(incoming.fields)
    return theirs is not None and mine is not None and mine < theirs


def generation_key(fields: Mapping[str, str]) -> tuple[int, str] | None:
    """A record's place in the order of its writers: (:data:`GENERATION_FIELD`,
    :data:`WRITER_FIELD`); None when it names no generation (or not an integer)."""
    generation = fields.get(GENERATION_FIELD)
    if not generation:
        return None
    try:
        return int(generation), fields.get(WRITER_FIELD, "")
    except ValueError:
        return None


def merged_size(previous: Message | None, incoming: Message) -> int:
    """``merge_snapshot(previous, incoming).size()`` (0 for a non-retained ``incoming``),
    in time proportional to ``incoming``'s fields only: MaxMessageSize applies to the
    merged snapshot, checked before the publish is taken."""
    if not incoming.retained:
        return 0
    size = incoming.size()
    if previous is None or not previous.fields:
        return size
    extra = previous.size() - len(previous.content) - _text_size(previous.subject)
    for name in incoming.fields:
        old = previous.fields.get(name)
        if old is not None:
            extra -= _text_size(name) + _text_size(old)
    return size + extra


def _text_size(text: str) -> int:
    return len(text) if text.isascii() else len(text.encode("utf-8", "surrogatepass"))
