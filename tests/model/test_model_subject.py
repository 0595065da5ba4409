import pytest
from hypothesis import given
from hypothesis import strategies as st

from migratory.model.subject import (
    MAX_SUBJECT_BYTES,
    InvalidSubjectError,
    is_valid_subject,
    validate_subject,
)

# Seed Table 4.2: Examples of Invalid Subjects.
TABLE_4_2 = [
    ("/Stocks//IBM/BID", "segment 2 is empty"),
    ("Stocks/IBM/BID", "does not start with '/'"),
    ("/Stocks/IBM/BID/", "ends with '/' (last segment is empty)"),
    ("/", "single empty segment"),
    ("/Stocks", "has only one segment (two or more are required)"),
]


@pytest.mark.parametrize(("subject", "reason"), TABLE_4_2)
def test_seed_invalid_subjects(subject: str, reason: str) -> None:
    with pytest.raises(InvalidSubjectError) as info:
        validate_subject(subject)
    assert reason in info.value.reason
    assert info.value.subject == subject
    assert str(info.value) == f"invalid subject {subject!r}: {info.value.reason}"
    assert not is_valid_subject(subject)


@pytest.mark.parametrize(
    ("subject", "reason"),
    [
        ("", "is empty"),
        ("//", "segment 1 is empty"),
        ("/a//", "segment 2 is empty"),
        ("/a/", "ends with '/'"),
        ("/a/b\x00", "U+0000"),
        ("/a/\tb", "U+0009"),
        ("/a/" + "x" * MAX_SUBJECT_BYTES, "bytes long"),
        ("/a/\ud800", "surrogate"),
    ],
)
def test_other_invalid_subjects(subject: str, reason: str) -> None:
    with pytest.raises(InvalidSubjectError) as info:
        validate_subject(subject)
    assert reason in info.value.reason


@pytest.mark.parametrize("subject", [None, 42, b"/a/b", ["/a", "b"]])
def test_non_str_is_invalid(subject: object) -> None:
    with pytest.raises(InvalidSubjectError, match="not a str"):
        validate_subject(subject)
    assert not is_valid_subject(subject)


@pytest.mark.parametrize(
    "subject",
    ["/Stocks/NYSE/IBM", "/a/b", "/Bourse/Société/ÉDF", "/株式/東証/7203", "/a b/c-d/e.f"],
)
def test_valid_subjects(subject: str) -> None:
    assert validate_subject(subject) is subject
    assert is_valid_subject(subject)


def test_length_limit_counts_utf8_bytes() -> None:
    prefix = "/a/"
    exact = prefix + "x" * (MAX_SUBJECT_BYTES - len(prefix))
    assert is_valid_subject(exact)
    # "é" is two bytes: as many characters as the limit allows, one byte over it.
    over = prefix + "é" + "x" * (MAX_SUBJECT_BYTES - len(prefix) - 1)
    assert len(over) == MAX_SUBJECT_BYTES
    assert not is_valid_subject(over)


segment = st.text(
    alphabet=st.characters(exclude_characters="/", exclude_categories=["Cs"], min_codepoint=0x20),
    min_size=1,
    max_size=20,
)


@given(st.lists(segment, min_size=2, max_size=10))
def test_joined_segments_are_valid(segments: list[str]) -> None:
    subject = "/" + "/".join(segments)
    assert validate_subject(subject) == subject


@given(st.text())
def test_validate_raises_only_invalid_subject_error(text: str) -> None:
    try:
        assert validate_subject(text) == text
    except InvalidSubjectError as error:
        assert error.reason
        assert not is_valid_subject(text)
    else:
        assert is_valid_subject(text)
