"""Why an item of a link frame is malformed: the slow path of :mod:`cluster.link_ops`'s
strict decoding, which names what is wrong once an item failed its fast check. Pure."""

from __future__ import annotations

from typing import Any, Final

__all__ = ["U64", "LinkError", "is_text_map", "is_u64", "kind", "message_fault"]

U64: Final = 2**64


class LinkError(Exception):
    """The peer broke the link protocol or failed authentication; close the link."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


def is_text_map(fields: dict[Any, Any]) -> bool:
    return all(type(k) is str and type(v) is str for k, v in fields.items())


def message_fault(item: Any, type_count: int) -> str:
    """Why ``item`` is not a message (an array of 8 items, the last its type code below
    ``type_count``)."""
    if type(item) is not list or len(item) != 8:
        return f"a message must be an array of 8 items, got {kind(item)}"
    subject, content, fields, flags, closure, epoch, seq, _type = item
    if type(subject) is not str:
        return "message subject must be a text string"
    if type(content) is not bytes:
        return "message content must be a byte string"
    if type(fields) is not dict or not is_text_map(fields):
        return "message fields must be a map of text to text"
    if type(flags) is not int or not 0 <= flags <= 3:
        return "message flags must be an integer from 0 to 3"
    if closure is not None and type(closure) is not str:
        return "message closure must be a text string or null"
    if not is_u64(epoch) or not is_u64(seq):
        return "message epoch and seq must be unsigned integers below 2**64"
    return f"message type must be an integer below {type_count}"


def is_u64(value: Any) -> bool:
    return type(value) is int and 0 <= value < U64


def kind(value: Any) -> str:
    if type(value) is list:
        return f"an array of {len(value)} items"
    return type(value).__name__
