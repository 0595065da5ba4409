"""The verdict; a chaos run stopped before its end is said to be unfinished next to it; the
settings a run gave every member (``chaos run --set``) are named."""

from __future__ import annotations

from spark_analysis.report import interrupted_note, settings_note, verdict


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


def test_a_run_without_violation_passes_and_one_with_a_crash_fails() -> None:
    """(A whole clean analysis's PASS: test_chaos_scenarios.py's run; tests/spark's correct
    history carries a member crash.)"""
    clean = {"sdk": {"lost": 0}, "members": {"unexpected_exits": 0}}
    assert verdict({"ok": True, "violations": clean}) == "**PASS** — no safety violation"
    crashed = {"sdk": {"lost": 0}, "members": {"unexpected_exits": 1}}
    assert verdict({"ok": False, "violations": crashed}) == (
        "**FAIL** — unexpected_exits (members: 1)")
