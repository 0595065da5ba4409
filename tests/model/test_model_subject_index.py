"""SubjectIndex: the subjects a set of topic filters matches, found by walking only the
levels the filters can match, and the work of that walk, counted."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from migratory.model import subject_index
from migratory.model.subject_index import SubjectIndex
from migratory.model.topic import FilterIndex, filter_levels, filter_matches

LEVELS = st.sampled_from(["a", "b", "c", "$x", "migratory"])
SUBJECTS = st.lists(LEVELS, min_size=2, max_size=4).map(lambda ls: "/" + "/".join(ls))
FILTERS = st.sampled_from([
    "a/+", "#", "+/#", "a/#", "+/b/#", "a/b", "+/+", "a/+/c", "+/+/+/+", "b/#", "a/b/#",
    "+/c", "c/+/+", "migratory/#", "migratory/+", "migratory/a/+",
])


def walk(index: SubjectIndex[str], filters: FilterIndex[Any]) -> tuple[dict[str, int], int]:
    """What ``match`` finds (subject -> best value, each subject once) and its visits."""
    found: dict[str, int] = {}
    visits = 0
    for item in index.match(filters):
        if isinstance(item, int):
            visits += item
        else:
            subject, best = item
            assert subject not in found
            found[subject] = best
            visits += 1
    return found, visits


def index_of(names: list[str]) -> FilterIndex[str]:
    filters: FilterIndex[str] = FilterIndex()
    for value, name in enumerate(names):
        filters.add(filter_levels(name), name, value)
    return filters


@settings(max_examples=150, deadline=None)
@given(st.sets(SUBJECTS, max_size=40), st.lists(FILTERS, min_size=1, max_size=4, unique=True),
       st.data())
def test_match_finds_what_filter_matches_finds(
    subjects: set[str], names: list[str], data: st.DataObject,
) -> None:
    index: SubjectIndex[str] = SubjectIndex()
    for subject in subjects:
        index.add(subject, subject)
    gone = data.draw(st.sets(st.sampled_from(sorted(subjects))) if subjects else st.just(set()))
    for subject in gone:
        index.remove(subject)
    kept = subjects - gone
    expected = {}
    for subject in kept:
        values = [v for v, n in enumerate(names) if filter_matches(filter_levels(n), subject)]
        if values and not subject.startswith("/$"):  # a wildcard never matches $...
            expected[subject] = max(values)
    assert walk(index, index_of(names))[0] == expected
    assert len(index) == len(kept)


def test_removing_every_subject_leaves_no_level_behind() -> None:
    index: SubjectIndex[int] = SubjectIndex()
    subjects = [f"/g{i % 7}/d{i}/t" for i in range(100)] + ["/g1/d1", "/g1/d1/t/u"]
    for i, subject in enumerate(subjects):
        index.add(subject, i)
    for subject in subjects:
        index.remove(subject)
    assert len(index) == 0
    assert walk(index, index_of(["#"])) == ({}, 1)  # the root alone


def test_a_filter_visits_the_levels_it_can_match_not_every_subject() -> None:
    """``a/+/c`` among 10,000 subjects under other first levels: the root, the level
    ``a`` and the levels and subjects under it, not the 10,000."""
    index: SubjectIndex[str] = SubjectIndex()
    for i in range(10_000):
        index.add(f"/other{i % 100}/d{i}/c", "unrelated")
    for i in range(20):
        index.add(f"/a/d{i}/c", f"/a/d{i}/c")
        index.add(f"/a/d{i}/x", "no")
    found, visits = walk(index, index_of(["a/+/c"]))
    assert sorted(found) == sorted(f"/a/d{i}/c" for i in range(20))
    # the root (1 name looked up), the level a, its 20 levels, 1 name looked up in each
    assert visits == (1 + 1) + 1 + 20 * (1 + 1) + 20
    found, visits = walk(index, index_of(["+/d5/c"]))  # each first level, a name in each
    assert sorted(found) == ["/a/d5/c", "unrelated"]  # (the value of /other5/d5/c)
    # the root, its 101 levels (1 name looked up in each), in 2 of them the level d5
    # (1 name looked up) and the subject found there
    assert visits == 1 + 101 * (1 + 1) + 2 * (1 + 1 + 1)


def test_a_level_of_many_levels_below_is_walked_a_step_at_a_time(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """``flat/+/x`` over 10,000 levels under ``flat``: between two items the walk
    yields, it looks at one level below, not at all 10,000 (they were all put on the
    walk's stack at once, 10,000 looks before the caller could count one)."""
    index: SubjectIndex[str] = SubjectIndex()
    for i in range(10_000):
        index.add(f"/flat/d{i}/t", "t")
    looks = [0]
    original = subject_index._below

    def counted(*args: Any) -> Any:
        looks[0] += 1
        return original(*args)

    monkeypatch.setattr(subject_index, "_below", counted)
    most = 0
    for _ in index.match(index_of(["flat/+/x"])):
        most = max(most, looks[0])
        looks[0] = 0
    assert most <= 2


def test_an_invalid_subject_takes_no_valid_subjects_place() -> None:
    """``Xa/b`` (a committed message of an older member's log, applied as committed)
    was kept as ``/a/b``: in its place, and when it expired it took ``/a/b`` out of the
    index (an MQTT wildcard subscribe then missed ``/a/b``'s retained message)."""
    index: SubjectIndex[str] = SubjectIndex()
    index.add("/a/b", "/a/b")
    index.add("Xa/b", "Xa/b")
    index.add("/a//b", "/a//b")
    assert walk(index, index_of(["#"]))[0] == {"/a/b": 0}
    index.remove("Xa/b")
    index.remove("/a//b")
    assert walk(index, index_of(["#"]))[0] == {"/a/b": 0}
    assert len(index) == 1
