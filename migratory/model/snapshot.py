"""Snapshot messages: the latest retained message with earlier fields merged in."""

from dataclasses import replace

from migratory.model.message import Message, MessageType
from migratory.model.subject import RESERVED_PREFIX

__all__ = ["RESERVED_PREFIX", "merge_snapshot", "merged_size"]

def merge_snapshot(previous: Message | None, incoming: Message) -> Message | None:
    """The subject's snapshot after ``incoming``, given its snapshot ``previous``.

    Only retained messages take part: a non-retained ``incoming`` returns ``previous``
    unchanged. Otherwise the result is ``incoming`` (content, position, qos, retained)
    with ``previous``'s fields updated by its own, type SNAPSHOT and no closure; on a
    :data:`RESERVED_PREFIX` subject an empty field of ``incoming`` removes the field.
    Raises ValueError when the two messages have different subjects.
    """
    if previous is not None and previous.subject != incoming.subject:
        raise ValueError(
            f"snapshot of {previous.subject!r} cannot merge a message of {incoming.subject!r}"
        )
    if not incoming.retained:
        return previous
    if previous is None or not previous.fields:
        fields = dict(incoming.fields)
    else:
        fields = dict(previous.fields)
        fields.update(incoming.fields)
    if incoming.subject.startswith(RESERVED_PREFIX):
        for name, value in incoming.fields.items():
            if not value:
                del fields[name]
    return replace(incoming, fields=fields, type=MessageType.SNAPSHOT, closure=None)


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
