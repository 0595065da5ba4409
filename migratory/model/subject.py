"""Subjects: ``/Stocks/NYSE/IBM`` — a leading slash and two or more non-empty segments."""

import re
from typing import Final

__all__ = [
    "MAX_SUBJECT_BYTES",
    "RESERVED_PREFIX",
    "InvalidSubjectError",
    "is_valid_subject",
    "reserved",
    "validate_subject",
]

MAX_SUBJECT_BYTES: Final = 1024
"""Largest subject accepted, counted in UTF-8 bytes."""

RESERVED_PREFIX: Final = "/$"
"""Subjects only the server writes: the persistent MQTT session records, the rebalancer's
load reports. No client may publish on them or subscribe to them, whatever its
entitlement (:func:`reserved`: a forged load report made members move their clients
away, server/publish_rules.py, server/rebalance.py; a session record or a load report
read by a client tells it other clients' positions or the cluster's members), and no
wildcard matches them. On them, a field whose value is empty is removed from the
snapshot, so that a record saved in parts -- the positions that changed, as fields -- can
also forget a position (see migratory/model/snapshot.py, migratory/server/mqtt_store.py)."""

_CONTROL = re.compile(r"[\x00-\x1f]")


class InvalidSubjectError(ValueError):
    """A subject that breaks the subject syntax; ``reason`` says which rule."""

    def __init__(self, subject: str, reason: str) -> None:
        super().__init__(subject, reason)
        self.subject = subject
        self.reason = reason

    def __str__(self) -> str:
        return f"invalid subject {self.subject!r}: {self.reason}"


_KNOWN_VALID: dict[str, None] = {}
"""Subjects found valid lately: a publisher repeats its subjects, and the check was ~3 %
of a publish's CPU (benchmarks/publish_path_cpu.py --profile). Bounded: emptied when full."""
KNOWN_VALID_LIMIT: Final = 65_536


def validate_subject(subject: object) -> str:
    """Return ``subject`` unchanged if it is a valid subject, else raise InvalidSubjectError."""
    if type(subject) is str and subject in _KNOWN_VALID:
        return subject
    if not isinstance(subject, str):
        raise InvalidSubjectError(repr(subject), f"is a {type(subject).__name__}, not a str")
    reason = _first_violation(subject)
    if reason is not None:
        raise InvalidSubjectError(subject, reason)
    _remember_valid(subject)
    return subject


def is_valid_subject(subject: object) -> bool:
    """Whether ``subject`` is a valid subject."""
    if type(subject) is str and subject in _KNOWN_VALID:
        return True
    if not isinstance(subject, str) or _first_violation(subject) is not None:
        return False
    _remember_valid(subject)
    return True


def _remember_valid(subject: str) -> None:
    if len(_KNOWN_VALID) >= KNOWN_VALID_LIMIT:
        _KNOWN_VALID.clear()
    _KNOWN_VALID[subject] = None


def _first_violation(subject: str) -> str | None:
    """The reason ``subject`` is invalid, or None when it is valid."""
    if not subject:
        return "is empty"
    try:
        size = len(subject.encode("utf-8"))
    except UnicodeEncodeError:
        return "is not encodable as UTF-8 (contains a lone surrogate)"
    if size > MAX_SUBJECT_BYTES:
        return f"is {size} bytes long in UTF-8 (at most {MAX_SUBJECT_BYTES} are allowed)"
    control = _CONTROL.search(subject)
    if control is not None:
        return f"contains control character U+{ord(control.group()):04X} at index {control.start()}"
    if subject[0] != "/":
        return "does not start with '/'"
    segments = subject[1:].split("/")
    if len(segments) == 1:
        if not segments[0]:
            return "is a single empty segment (two or more non-empty segments are required)"
        return "has only one segment (two or more are required)"
    last = len(segments)
    for number, segment in enumerate(segments, start=1):
        if not segment:
            if number == last:
                return "ends with '/' (last segment is empty)"
            return f"segment {number} is empty"
    return None


def reserved(subject: str) -> str | None:
    """Why no client may publish on or subscribe to ``subject``; None if it may."""
    if subject.startswith(RESERVED_PREFIX):
        return f"{RESERVED_PREFIX} subjects are the server's own (reserved)"
    return None
