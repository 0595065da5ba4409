"""A message on the cluster link: its CBOR item (an array of 8) and its strict decoding
(:mod:`cluster.link_ops` frames carry them). Pure."""

from __future__ import annotations

from typing import Any, Final

from cluster.link_faults import U64, LinkError, is_text_map, message_fault
from migratory.model.message import Message, MessageType, Qos, new_message

__all__ = ["decode_message", "message_item"]

_TYPE_CODES: Final = {
    MessageType.UPDATE: 0,
    MessageType.SNAPSHOT: 1,
    MessageType.RECOVERED: 2,
    MessageType.HISTORICAL: 3,
}
_TYPES: Final = tuple(sorted(_TYPE_CODES, key=_TYPE_CODES.__getitem__))
_RETAINED: Final = 1
_GUARANTEED: Final = 2


def message_item(m: Message) -> list[Any]:
    fields = m.fields if type(m.fields) is dict else dict(m.fields)
    flags = (_RETAINED if m.retained else 0) | (_GUARANTEED if m.qos is Qos.GUARANTEED else 0)
    return [m.subject, m.content, fields, flags, m.closure, m.epoch, m.seq, _TYPE_CODES[m.type]]


def decode_message(item: Any, where: str) -> Message:
    if type(item) is list and len(item) == 8:
        subject, content, fields, flags, closure, epoch, seq, code = item
        if (
            type(subject) is str
            and type(content) is bytes
            and type(fields) is dict
            and type(flags) is int
            and 0 <= flags <= 3
            and (closure is None or type(closure) is str)
            and type(epoch) is int
            and 0 <= epoch < U64
            and type(seq) is int
            and 0 <= seq < U64
            and type(code) is int
            and 0 <= code < len(_TYPES)
            and (not fields or is_text_map(fields))
        ):
            qos = Qos.GUARANTEED if flags & _GUARANTEED else Qos.STANDARD
            retained = bool(flags & _RETAINED)
            return new_message(  # not Message(): ~1 us less per message (see _number)
                subject, content, fields, retained, qos, closure, epoch, seq, _TYPES[code]
            )
    raise LinkError(f"{where}: {message_fault(item, len(_TYPES))}")
