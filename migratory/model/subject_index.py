"""Subjects by levels: which subjects a set of MQTT topic filters matches, visiting only
the branches the filters can match.

``/g7/d12/t`` is kept as level ``g7`` -> level ``d12`` -> subject ``t``: one dict entry
per subject (its last level) plus one :class:`_Level` per distinct prefix. A filter
``g7/+/t`` then visits the levels under ``g7`` only, ``+/d12/t`` every first level but
one subject under each, and ``#`` everything -- which is why :meth:`SubjectIndex.match`
is a generator that yields, between the subjects it finds, how many levels, names and
subjects it looked at without a match: the caller counts the visits and stops when its
budget is spent (:class:`migratory.server.hub_sinks.SubjectScan`), going on at a later
turn. Each
level's names are copied before it is walked (one C-level copy of pointers), so subjects
added or removed meanwhile do not break a walk that spans several turns: it skips the
subjects removed since, and misses those added since to a level it has passed.

Subjects whose first level starts with ``$`` (the server's own: session records) are
never matched; the meta-subjects (first level ``migratory``, :data:`META_LEVEL`) only
by a filter whose first level is that name, as MQTT's ``$SYS``. Nor are those with a
level holding ``+`` or ``#``: they name no MQTT topic (``topic.names_a_topic``).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any, Generic, TypeVar

from migratory.model.subject import is_valid_subject
from migratory.model.topic import META_LEVEL, FilterIndex, FilterNode

__all__ = ["SubjectIndex"]

Value = TypeVar("Value")


class _Level(Generic[Value]):
    __slots__ = ("branches", "subjects")

    def __init__(self) -> None:
        # made at the first entry (most levels hold only one of them): until then both
        # are _NOTHING, read but never written
        self.branches: dict[str, _Level[Value]] = _NOTHING  # next level -> levels below
        self.subjects: dict[str, Value] = _NOTHING  # last level -> the subject's value


_NOTHING: dict[str, Any] = {}


def _best(table: dict[Any, int], best: int) -> int:
    for value in table.values():
        if value > best:
            best = value
    return best


class SubjectIndex(Generic[Value]):
    """Subjects (``/a/b/c``) -> a value each, kept as a tree of their levels."""

    def __init__(self) -> None:
        self._root: _Level[Value] = _Level()
        self._count = 0

    def __len__(self) -> int:
        return self._count

    def add(self, subject: str, value: Value) -> None:
        """``subject``'s value; an invalid subject is not kept (a committed message of an
        older member's log, applied as committed): ``Xa/b`` was kept as ``/a/b`` -- in
        its place, and its expiry removed ``/a/b`` from the index."""
        if not is_valid_subject(subject):
            return
        *path, last = subject[1:].split("/")
        level = self._root
        for name in path:
            below = level.branches.get(name)
            if below is None:
                if level.branches is _NOTHING:
                    level.branches = {}
                below = level.branches[name] = _Level()
            level = below
        if level.subjects is _NOTHING:
            level.subjects = {}
        if last not in level.subjects:
            self._count += 1
        level.subjects[last] = value

    def remove(self, subject: str) -> None:
        if not is_valid_subject(subject):
            return  # never added
        *path, last = subject[1:].split("/")
        levels = [self._root]
        for name in path:
            below = levels[-1].branches.get(name)
            if below is None:
                return
            levels.append(below)
        if levels[-1].subjects.pop(last, None) is not None:
            self._count -= 1
        for depth in range(len(levels) - 1, 0, -1):  # prune the levels left empty
            level = levels[depth]
            if level.branches or level.subjects:
                break
            del levels[depth - 1].branches[path[depth - 1]]

    def match(self, filters: FilterIndex[Any]) -> Iterator[tuple[Value, int] | int]:
        """``(value, best)`` of every subject one of ``filters`` matches, once each,
        ``best`` the highest value of the filters matching it; between them, the number
        of other visits (levels entered, names looked up, subjects that no filter
        matches): a matched subject is one visit, an int that many."""
        root = filters.root
        stack = [self._walk(self._root, (root,), -1, 0)]
        while stack:
            step = next(stack[-1], None)
            if step is None:
                stack.pop()
            elif isinstance(step, tuple) and isinstance(step[0], _Level):
                stack.append(self._walk(*step))  # a level below: walked next (depth first)
            else:
                yield step

    def _walk(
        self, level: _Level[Value], nodes: tuple[FilterNode[Any], ...], inherited: int,
        depth: int,
    ) -> Iterator[Any]:
        """One level: its subjects (as :meth:`match` yields them), then each level
        below that a filter can match, as ``(level, nodes, inherited, depth)`` to walk."""
        for node in nodes:  # a filter ending in '#' here matches all that is below
            inherited = _best(node.rest, inherited)
        if inherited >= 0 or any("+" in node.children for node in nodes):
            subjects = list(level.subjects)  # names: a C-level copy of pointers
            branches = list(level.branches)
            looked = 0  # each subject and level counts as it is visited, below
        else:
            subjects, branches, looked = _named(level, nodes)
        yield 1 + looked
        for name in subjects:
            value = level.subjects.get(name)
            if (value is None or (depth == 0 and name.startswith("$"))
                    or "+" in name or "#" in name):
                continue  # removed since the copy; the server's own; no topic name
            best = inherited
            for node in _below(nodes, name):
                best = _best(node.rest, _best(node.here, best))
            yield 1 if best < 0 else (value, best)
        for name in branches:
            below = level.branches.get(name)
            if (below is None or (depth == 0 and name.startswith("$"))
                    or "+" in name or "#" in name):
                continue
            if depth == 0 and name == META_LEVEL:  # a filter's literal first level only
                literal = self._meta(nodes)
                if literal is not None:
                    yield (below, (literal,), -1, 1)
                continue
            deeper = tuple(n for n in _below(nodes, name) if n.children or n.rest)
            if deeper or inherited >= 0:
                yield (below, deeper, inherited, depth + 1)
            else:
                yield 1

    @staticmethod
    def _meta(nodes: tuple[FilterNode[Any], ...]) -> FilterNode[Any] | None:
        """The filters' literal first level META_LEVEL (``nodes`` is the root alone)."""
        return nodes[0].children.get(META_LEVEL)


def _named(
    level: _Level[Value], nodes: tuple[FilterNode[Any], ...]
) -> tuple[list[str], list[str], int]:
    """The names of the subjects and levels under ``level`` the filters' literal names
    lead to, and the names looked up -- or the level's entries filtered by the filters'
    names, if there are fewer."""
    names = dict.fromkeys(name for node in nodes for name in node.children)
    subjects, branches = level.subjects, level.branches
    entries = len(subjects) + len(branches)
    if len(names) > entries:
        return ([n for n in subjects if n in names], [n for n in branches if n in names],
                entries)
    return [n for n in names if n in subjects], [n for n in names if n in branches], len(names)


def _below(nodes: tuple[FilterNode[Any], ...], name: str) -> Iterator[FilterNode[Any]]:
    """The filter nodes one level down along ``name``: its literal child and ``+``."""
    for node in nodes:
        child = node.children.get(name)
        if child is not None:
            yield child
        child = node.children.get("+")
        if child is not None:
            yield child
