"""MQTT topics and topic filters, and how they map to subjects.

Topic ``a/b/c`` is subject ``/a/b/c``: a leading slash is added on the way in and
removed on the way out. What a subject cannot be, a topic cannot be either: a
topic needs two or more non-empty levels. Refused topics (names and filters):
empty levels (``a//b``, ``/a/b``, ``a/b/``), a single level (``a``), topics that
start with ``$`` (reserved for the server, as ``$SYS`` is elsewhere), control
characters, more than 1024 bytes. A topic *name* (PUBLISH, will) may not contain
``+`` or ``#``; in a *filter* ``+`` stands for one whole level and ``#`` for any
number of levels (zero or more) at the end only. A *subject* holding ``+`` or ``#``
(valid natively and over HTTP) names no topic (:func:`names_a_topic`): no filter
matches it, so it is never sent to an MQTT session -- a PUBLISH may not carry a
wildcard in its topic name (MQTT 3.1.1, [MQTT-3.3.2-2]), and a filter cannot name it
exactly either.

:class:`FilterIndex` finds, for one subject, everything subscribed to a filter
that matches it, walking a tree of levels: the cost grows with the depth of the
subject, not with the number of filters.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Generic, TypeVar

from migratory.model.subject import InvalidSubjectError, validate_subject

__all__ = [
    "FilterIndex",
    "FilterNode",
    "InvalidTopicError",
    "filter_levels",
    "is_wildcard",
    "names_a_topic",
    "subject_to_topic",
    "topic_to_subject",
]

Sink = TypeVar("Sink")

META_LEVEL = "migratory"
"""The first level of the meta-subjects (``/migratory/...``, server/meta_subjects.py),
which only holders of the MonitorToken may read: as MQTT's ``$SYS`` topics, a filter
whose first level is a wildcard (``#``, ``+/stats/+``) never matches them."""


class InvalidTopicError(ValueError):
    def __init__(self, topic: str, reason: str) -> None:
        super().__init__(topic, reason)
        self.topic = topic
        self.reason = reason

    def __str__(self) -> str:
        return f"invalid topic {self.topic!r}: {self.reason}"


def _subject(topic: str) -> str:
    if not topic:
        raise InvalidTopicError(topic, "is empty")
    if topic.startswith("$"):
        raise InvalidTopicError(topic, "starts with '$' (reserved)")
    subject = "/" + topic
    try:
        return validate_subject(subject)
    except InvalidSubjectError as exc:
        raise InvalidTopicError(topic, f"as subject {subject!r} {exc.reason}") from None


def topic_to_subject(topic: str) -> str:
    """The subject of a topic *name*; InvalidTopicError if it has none."""
    if "+" in topic or "#" in topic:
        raise InvalidTopicError(topic, "a topic name may not contain '+' or '#'")
    return _subject(topic)


def names_a_topic(subject: str) -> bool:
    """Whether ``subject`` (valid) is a topic name an MQTT session may be sent: one
    without ``+`` or ``#``, which only a filter may hold."""
    return "+" not in subject and "#" not in subject


def subject_to_topic(subject: str) -> str:
    return subject[1:]


def is_wildcard(topic_filter: str) -> bool:
    return "+" in topic_filter or "#" in topic_filter


def filter_levels(topic_filter: str) -> tuple[str, ...]:
    """The levels of a valid topic filter; InvalidTopicError if it is not valid."""
    if not is_wildcard(topic_filter):
        _subject(topic_filter)
        return tuple(topic_filter.split("/"))
    # check the literal levels by the subject rules, wildcards replaced by a letter
    levels = tuple(topic_filter.split("/"))
    for number, level in enumerate(levels, start=1):
        if level == "#" and number != len(levels):
            raise InvalidTopicError(topic_filter, "'#' must be the last level")
        if level not in ("+", "#") and ("+" in level or "#" in level):
            raise InvalidTopicError(
                topic_filter, f"level {number} mixes a wildcard with other characters"
            )
    probe = "/".join("x" if level in ("+", "#") else level for level in levels)
    if len(levels) == 1:
        probe += "/x"  # '#' and '+' alone are valid filters
    try:
        _subject(probe)
    except InvalidTopicError as exc:
        raise InvalidTopicError(topic_filter, exc.reason.replace(repr(probe), "")) from None
    return levels


class FilterNode(Generic[Sink]):
    """One level of a :class:`FilterIndex`: read by
    :class:`migratory.model.subject_index.SubjectIndex`, changed only by the index."""

    __slots__ = ("children", "here", "rest")

    def __init__(self) -> None:
        self.children: dict[str, FilterNode[Sink]] = {}
        self.here: dict[Sink, int] = {}  # filters ending at this level
        self.rest: dict[Sink, int] = {}  # filters ending in '#' below this level


class FilterIndex(Generic[Sink]):
    """Wildcard filters -> subscribers with a value (their granted QoS)."""

    def __init__(self) -> None:
        self._root: FilterNode[Sink] = FilterNode()
        self.count = 0  # filters held (read it; the hub tests it per message)

    def __len__(self) -> int:
        return self.count

    @property
    def root(self) -> FilterNode[Sink]:
        return self._root

    def add(self, levels: tuple[str, ...], sink: Sink, value: int) -> None:
        node = self._root
        for level in levels[:-1] if levels[-1] == "#" else levels:
            node = node.children.setdefault(level, FilterNode())
        table = node.rest if levels[-1] == "#" else node.here
        if sink not in table:
            self.count += 1
        table[sink] = value

    def remove(self, levels: tuple[str, ...], sink: Sink) -> None:
        path = [self._root]
        for level in levels[:-1] if levels[-1] == "#" else levels:
            child = path[-1].children.get(level)
            if child is None:
                return
            path.append(child)
        table = path[-1].rest if levels[-1] == "#" else path[-1].here
        if table.pop(sink, None) is not None:
            self.count -= 1
        names = [lv for lv in (levels[:-1] if levels[-1] == "#" else levels)]
        for depth in range(len(path) - 1, 0, -1):  # prune empty branches
            node = path[depth]
            if node.children or node.here or node.rest:
                break
            del path[depth - 1].children[names[depth - 1]]

    def match(self, subject: str) -> Iterator[tuple[Sink, int]]:
        """Every (sink, value) whose filter matches ``subject`` (a sink may come twice);
        none for a subject holding ``+`` or ``#`` (:func:`names_a_topic`)."""
        if "+" in subject or "#" in subject:
            return
        levels = subject[1:].split("/")
        stack = [(self._root, 0)]
        if levels[0] == META_LEVEL:  # no first-level wildcard (META_LEVEL)
            child = self._root.children.get(META_LEVEL)
            stack = [] if child is None else [(child, 1)]
        last = len(levels)
        while stack:
            node, depth = stack.pop()
            yield from node.rest.items()
            if depth == last:
                yield from node.here.items()
                continue
            for key in (levels[depth], "+"):
                child = node.children.get(key)
                if child is not None:
                    stack.append((child, depth + 1))


def filter_matches(levels: tuple[str, ...], subject: str) -> bool:
    """Whether a filter (its levels) matches ``subject``."""
    if not names_a_topic(subject):
        return False
    names = subject[1:].split("/")
    if names[0] == META_LEVEL and levels[0] in ("+", "#"):
        return False
    for i, level in enumerate(levels):
        if level == "#":
            return True
        if i >= len(names) or (level != "+" and level != names[i]):
            return False
    return len(levels) == len(names)
