"""Messages: subject, content, fields, and the position the server gives them."""

import enum
from collections.abc import Mapping
from dataclasses import dataclass, field

from migratory.model.position import Position

__all__ = ["Message", "MessageType", "Qos"]


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
        return Position(self.epoch, self.seq)

    # direct constructor calls: dataclasses.replace cost ~2.5 µs of each publish's ~30
    # (benchmarks/publish_path_cpu.py --profile)
    def with_position(self, epoch: int, seq: int) -> "Message":
        """A copy placed at ``(epoch, seq)``."""
        return Message(
            self.subject, self.content, self.fields, self.retained, self.qos, self.closure,
            epoch, seq, self.type,
        )

    def as_type(self, t: MessageType) -> "Message":
        """A copy of type ``t``."""
        return Message(
            self.subject, self.content, self.fields, self.retained, self.qos, self.closure,
            self.epoch, self.seq, t,
        )

    def size(self) -> int:
        """Bytes counted against the message size limit.

        The content plus the UTF-8 lengths of the subject, field names and field values.
        """
        total = len(self.content) + _utf8_len(self.subject)
        for name, value in self.fields.items():
            total += _utf8_len(name) + _utf8_len(value)
        return total
