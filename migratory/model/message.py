"""Messages: subject, content, fields, and the position the server gives them."""

import enum
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from itertools import chain
from operator import itemgetter
from typing import Any

from migratory.model.frozen import positional_constructor
from migratory.model.position import Position, new_position

__all__ = [
    "FIELD_TEXT_MEMORY", "PACKED_EPOCH", "Message", "MessageType", "PackedMessage", "Qos",
    "new_message", "pack", "unpack",
]


class Qos(enum.StrEnum):
    """Delivery quality asked for by the publisher."""

    STANDARD = "standard"
    GUARANTEED = "guaranteed"


class MessageType(enum.StrEnum):
    """How a message reaches a subscriber."""

    SNAPSHOT = "snapshot"
    """The subject's snapshot, sent first on subscribe."""
    UPDATE = "update"
    """A live message."""
    RECOVERED = "recovered"
    """A message replayed from the cache after a resubscribe with a position."""
    HISTORICAL = "historical"
    """A message replayed from the cache on request for history."""


def _utf8_len(text: str) -> int:
    return len(text) if text.isascii() else len(text.encode("utf-8", "surrogatepass"))


@dataclass(frozen=True, slots=True)
class Message:
    """One message of a subject.

    ``fields`` must not be mutated once the message is built. ``closure`` is the
    publisher's id for its acknowledgement. ``epoch``, ``seq`` and ``type`` are set by
    the server.
    """

    subject: str
    content: bytes
    fields: Mapping[str, str] = field(default_factory=dict)
    retained: bool = False
    qos: Qos = Qos.STANDARD
    closure: str | None = None
    epoch: int = 0
    seq: int = 0
    type: MessageType = MessageType.UPDATE

    @property
    def position(self) -> Position:
        """The message's ``(epoch, seq)``."""
        return new_position(self.epoch, self.seq)

    # direct constructor calls: dataclasses.replace cost ~2.5 µs of each publish's ~30
    # (benchmarks/publish_path_cpu.py --profile)
    def with_position(self, epoch: int, seq: int) -> "Message":
        """A copy placed at ``(epoch, seq)``."""
        return new_message(
            self.subject, self.content, self.fields, self.retained, self.qos, self.closure,
            epoch, seq, self.type,
        )

    def as_type(self, t: MessageType) -> "Message":
        """A copy of type ``t``."""
        return new_message(
            self.subject, self.content, self.fields, self.retained, self.qos, self.closure,
            self.epoch, self.seq, t,
        )

    def size(self) -> int:
        """Bytes counted against the message size limit.

        The content plus the UTF-8 lengths of the subject, field names and field values.
        """
        subject = self.subject  # (the usual case inline: twice per publish)
        total = len(self.content) + (len(subject) if subject.isascii() else _utf8_len(subject))
        if self.fields:
            for name, value in self.fields.items():
                total += _utf8_len(name) + _utf8_len(value)
        return total


new_message = positional_constructor(Message)
"""``Message(...)`` with every field given in order, at half the cost (see
:mod:`migratory.model.frozen`): for the publish path."""


# A message as one flat tuple of immutable atoms: (subject, content, retained, qos,
# closure, epoch, seq, type, then each field's name and value). CPython's collector
# stops tracking such a tuple the first time it sees it (a nested tuple can take two
# collections), so long-lived copies -- a member's replicated cache, its ring of recent
# batches -- cost full collections nothing; a ``Message`` is always tracked, and 50,000
# of them on a seed made a full collection stop it for ~180 ms (docs/benchmarks.md,
# issue 8).
PackedMessage = tuple[Any, ...]
PACKED_EPOCH = 5
_PACKED_FIELDS = 8


def pack(message: Message) -> PackedMessage:
    """``message`` as a tuple the collector does not track."""
    packed = (
        message.subject, message.content, message.retained, message.qos._value_,
        message.closure, message.epoch, message.seq, message.type._value_,
    )
    if message.fields:
        return packed + tuple(chain.from_iterable(message.fields.items()))
    return packed


FIELD_TEXT_MEMORY = 64
"""Bytes a memory budget counts for each field name and each field value a stored
message holds, beyond its length: its ``str`` object (49 bytes of header for ASCII, more
otherwise, rounded up by the allocator) and its slot in the flat tuple (8). Counting the
text's length alone made a message of many tiny fields -- 20,000 names of 4 characters,
75 KB by MaxMessageSize's count -- take ~8 times what a cache's budget counted
(docs/benchmarks.md, "Fields a budget did not count")."""


def packed_size(packed: PackedMessage) -> int:
    """What a packed message counts against a memory budget: content, subject and field
    lengths (characters for the text: deterministic, and close enough), and
    :data:`FIELD_TEXT_MEMORY` per field name and value."""
    size = len(packed[1]) + len(packed[0])
    for text in packed[_PACKED_FIELDS:]:
        size += len(text) + FIELD_TEXT_MEMORY
    return size


_QOS = {q._value_: q for q in Qos}
_TYPES = {t._value_: t for t in MessageType}


def packed_sizes(packed: Sequence[PackedMessage]) -> int:
    """``sum(map(packed_size, packed))``, most of it in C (a seed loading a Raft dump sums
    the sizes of every cached message, 660,000 of them, on its Raft thread): the same
    integer, so every seed's budget counts the same bytes."""
    size = sum(map(len, map(itemgetter(1), packed))) + sum(map(len, map(itemgetter(0), packed)))
    if max(map(len, packed), default=0) > _PACKED_FIELDS:  # some have fields
        size += sum(len(text) for one in packed for text in one[_PACKED_FIELDS:])
        size += FIELD_TEXT_MEMORY * (sum(map(len, packed)) - _PACKED_FIELDS * len(packed))
    return size


def unpack(packed: PackedMessage) -> Message:
    """The message :func:`pack` made ``packed`` from. (The enums by look-up, not
    ``Qos(qos)`` and ``MessageType(kind)``: those two calls were ~1.5 of ~2.8 us, and a
    seed taking a Raft dump unpacks every cached message on its Raft thread, 660,000 with
    the default CacheMemoryBudget.)"""
    subject, content, retained, qos, closure, epoch, seq, kind = packed[:_PACKED_FIELDS]
    fields = (
        dict(zip(packed[_PACKED_FIELDS::2], packed[_PACKED_FIELDS + 1::2], strict=True))
        if len(packed) > _PACKED_FIELDS else {}
    )
    try:
        qos_member, kind_member = _QOS[qos], _TYPES[kind]
    except KeyError:
        raise ValueError(f"not a packed message: qos {qos!r}, type {kind!r}") from None
    return new_message(
        subject, content, fields, retained, qos_member, closure, epoch, seq, kind_member
    )
