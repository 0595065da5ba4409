"""A chaos run stopped before its end is said to be unfinished next to the verdict; the
settings a run gave every member (``chaos run --set``) are named."""

from __future__ import annotations

from spark_analysis.report import interrupted_note, settings_note


def test_an_interrupted_run_is_flagged_and_a_finished_one_is_not() -> None:
    note = interrupted_note({"run": "r", "exit_code": 130})
    assert note and "did not finish (runner exit 130)" in note[0]
    assert "Judge only a run that finished" in note[0]
    assert interrupted_note({"run": "r", "exit_code": 0}) == []
    assert interrupted_note({"run": "r"}) == []


def test_the_members_settings_of_a_run_are_named() -> None:
    note = settings_note({"run": "r", "settings": {"MaxCachedMessagesPerSubject": "3"}})
    assert note and note[0] == "Member settings (`--set`): MaxCachedMessagesPerSubject = 3"
    assert settings_note({"run": "r", "settings": {}}) == []
    assert settings_note({"run": "r"}) == []
