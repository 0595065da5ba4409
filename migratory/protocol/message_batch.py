"""Delivered messages decoded for a client, in as little memory as a frame allows.

Sans-I/O, used by :func:`migratory.protocol.ops.decode_server_op` (the SDKs). Decoding
a ``batch`` the plain way, cbor2 first builds every message's map -- about 670 bytes of
dict and keys per message, ten times a small message's 65 bytes on the wire -- and then
the messages beside them: a 64 MiB frame of small messages peaked near 1 GB. Here a
large frame's message maps are turned into messages as cbor2 finishes each one (its
``object_hook``), so no more than one map is alive at a time; and what repeats from one
message to the next -- the subject, the epoch, empty fields -- is one object, not one
per message. ``benchmarks/sdk_decode_memory.py`` measures both.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from types import MappingProxyType
from typing import Any, Final

from migratory.model.message import Message, MessageType, Qos, new_message
from migratory.protocol.cbor_reader import REQUIRED, OperationError, Reader, bad, load_map

__all__ = ["EMPTY_FIELDS", "HOOKED_FROM_BYTES", "decode_message", "load_server_map"]

EMPTY_FIELDS: Final[Mapping[str, str]] = MappingProxyType({})
"""The fields of every decoded message that has none: one read-only mapping."""
HOOKED_FROM_BYTES = 64 * 1024
"""Frames from this size on are decoded through the hook (below it, a plain decode is
as small, and cheaper to set up)."""

Share = Callable[[Any], Any]


def _no_share(value: Any) -> Any:
    return value


def decode_message(item: Any, share: Share = _no_share) -> Message:
    """One message map (as ``message``, without ``op``); ``share`` gives the object to
    keep for a subject or an epoch (the same for equal values of one frame)."""
    if not isinstance(item, dict):
        raise bad("message: expected a map")
    r = Reader(item, "message")
    type_name = r.text("type", "update")
    qos_name = r.text("qos", "standard")
    try:
        message_type = MessageType(type_name)
        qos = Qos(qos_name)
    except ValueError:
        raise bad(f"message: unknown type {type_name!r} or qos {qos_name!r}") from None
    subject = share(r.text("subject", REQUIRED))
    content = r.bytes_("content")
    fields = r.fields("fields") or EMPTY_FIELDS
    retained = r.boolean("retained", False)
    epoch = share(r.served_epoch("epoch", REQUIRED))  # a message always has its position
    return new_message(subject, content, fields, retained, qos, None, epoch,
                       r.integer("seq", REQUIRED), message_type)


def load_server_map(payload: bytes) -> dict[Any, Any]:
    """The frame's one CBOR map (:func:`load_map`); in a large frame, every map that is a
    message -- its ``content`` bytes, no ``op`` -- is already a :class:`Message` (one that
    is not a valid message stays a map: decoding it again names what is wrong)."""
    if len(payload) < HOOKED_FROM_BYTES:
        return load_map(payload, whole=True)
    shared: dict[Any, Any] = {}
    share = shared.setdefault

    def share_value(value: Any) -> Any:
        return share(value, value)

    def hook(item: dict[Any, Any], _immutable: bool) -> Any:  # cbor2 6's ObjectHook
        if type(item.get("content")) is bytes and "op" not in item:
            try:
                return decode_message(item, share_value)
            except OperationError:
                return item
        return item

    return load_map(payload, whole=True, object_hook=hook)
