"""A chaos run stopped before its end is said to be unfinished next to the verdict."""

from __future__ import annotations

from spark_analysis.report import interrupted_note


def test_an_interrupted_run_is_flagged_and_a_finished_one_is_not() -> None:
    note = interrupted_note({"run": "r", "exit_code": 130})
    assert note and "did not finish (runner exit 130)" in note[0]
    assert "Judge only a run that finished" in note[0]
    assert interrupted_note({"run": "r", "exit_code": 0}) == []
    assert interrupted_note({"run": "r"}) == []
