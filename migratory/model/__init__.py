"""The pure model: subjects, messages, positions, snapshots, cache, conflation, batching.

No I/O here: nothing in this package imports trio, sockets or threads.
"""

from migratory.model.cache import SubjectCache
from migratory.model.conflation import Conflator, round_conflation_ms
from migratory.model.message import Message, MessageType, Qos
from migratory.model.outbox import Outbox, SlowConsumer
from migratory.model.position import Position, new_epoch
from migratory.model.snapshot import merge_snapshot
from migratory.model.subject import (
    MAX_SUBJECT_BYTES,
    InvalidSubjectError,
    is_valid_subject,
    validate_subject,
)

__all__ = [
    "MAX_SUBJECT_BYTES",
    "Conflator",
    "InvalidSubjectError",
    "Message",
    "MessageType",
    "Outbox",
    "Position",
    "Qos",
    "SlowConsumer",
    "SubjectCache",
    "is_valid_subject",
    "merge_snapshot",
    "new_epoch",
    "round_conflation_ms",
    "validate_subject",
]
