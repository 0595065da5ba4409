"""Topic <-> subject mapping, topic filters, and the wildcard index."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from migratory.model.topic import (
    FilterIndex,
    InvalidTopicError,
    filter_levels,
    filter_matches,
    subject_to_topic,
    topic_to_subject,
)


def test_topic_maps_to_subject_and_back() -> None:
    assert topic_to_subject("Stocks/NYSE/IBM") == "/Stocks/NYSE/IBM"
    assert subject_to_topic("/Stocks/NYSE/IBM") == "Stocks/NYSE/IBM"


@pytest.mark.parametrize(
    ("topic", "reason"),
    [
        ("", "is empty"),
        ("a", "only one segment"),
        ("/a/b", "segment 1 is empty"),
        ("a//b", "segment 2 is empty"),
        ("a/b/", "ends with '/'"),
        ("$SYS/broker", "starts with '$'"),
        ("a/+", "may not contain '+' or '#'"),
        ("a/#", "may not contain '+' or '#'"),
        ("a/\x01", "control character"),
        ("a/" + "x" * 1100, "bytes long"),
    ],
)
def test_refused_topic_names(topic: str, reason: str) -> None:
    with pytest.raises(InvalidTopicError) as caught:
        topic_to_subject(topic)
    assert reason in str(caught.value)


@pytest.mark.parametrize(
    "good", ["#", "+", "a/#", "a/+", "+/b", "+/+/c", "a/b", "a/+/c/#", "+/#"]
)
def test_valid_filters(good: str) -> None:
    assert filter_levels(good) == tuple(good.split("/"))


@pytest.mark.parametrize("bad", ["a", "a/#/b", "a/b#", "a+/b", "/a/+", "a//#", "$SYS/#", ""])
def test_refused_filters(bad: str) -> None:
    with pytest.raises(InvalidTopicError):
        filter_levels(bad)


@pytest.mark.parametrize(
    ("topic_filter", "subject", "matches"),
    [
        ("a/b", "/a/b", True),
        ("a/+", "/a/b", True),
        ("a/+", "/a/b/c", False),
        ("a/#", "/a/b/c", True),
        ("a/b/#", "/a/b", True),  # '#' also matches the parent level
        ("#", "/x/y", True),
        ("+/+", "/x/y", True),
        ("+/+", "/x/y/z", False),
        ("+/b/#", "/a/c/d", False),
    ],
)
def test_filter_matching(topic_filter: str, subject: str, matches: bool) -> None:
    levels = filter_levels(topic_filter)
    assert filter_matches(levels, subject) is matches
    index: FilterIndex[str] = FilterIndex()
    index.add(levels, "sink", 1)
    assert (list(index.match(subject)) == [("sink", 1)]) is matches


LEVEL = st.sampled_from(["a", "b", "c"])
FILTER = st.lists(st.sampled_from(["a", "b", "c", "+"]), min_size=2, max_size=4).flatmap(
    lambda levels: st.sampled_from(["/".join(levels), "/".join([*levels, "#"])])
)


@given(st.lists(FILTER, max_size=8, unique=True), st.lists(LEVEL, min_size=2, max_size=5),
       st.lists(st.integers(0, 7), max_size=4))
def test_index_agrees_with_the_plain_rule(
    filters: list[str], subject_levels: list[str], removed: list[int]
) -> None:
    index: FilterIndex[str] = FilterIndex()
    for f in filters:
        index.add(filter_levels(f), f, 0)
    gone = {filters[i] for i in removed if i < len(filters)}
    for f in gone:
        index.remove(filter_levels(f), f)
    subject = "/" + "/".join(subject_levels)
    expected = {f for f in filters if f not in gone and filter_matches(filter_levels(f), subject)}
    assert {sink for sink, _ in index.match(subject)} == expected
    assert len(index) == len(filters) - len(gone)


def test_a_subject_holding_a_wildcard_matches_no_filter() -> None:
    """``/a/x+y`` is a valid subject but no topic name (docs/mqtt.md): before,
    ``a/+`` and ``#`` matched it and its messages went out with that topic."""
    index: FilterIndex[str] = FilterIndex()
    for name in ("#", "a/+", "a/+/c", "+/#"):
        index.add(filter_levels(name), name, 0)
    for subject in ("/a/x+y", "/a/+", "/a/#", "/a/+/c", "/a/b#"):
        assert list(index.match(subject)) == []
        assert not any(filter_matches(filter_levels(name), subject)
                       for name in ("#", "a/+", "a/+/c", "+/#"))
    assert sorted(sink for sink, _ in index.match("/a/b")) == ["#", "+/#", "a/+"]
