"""Failover timings' pure arithmetic (spark_analysis/timings.py), without Spark."""

from __future__ import annotations

from spark_analysis.timings import fault_windows, leader_elections


def test_a_sigterm_of_the_leader_counts_as_a_leader_fault() -> None:
    """A rolling restart stops the leader with SIGTERM (a ``stop`` row): the election
    after it is measured like a kill's."""
    faults = [
        {"time": 10.0, "fault": "stop", "target": "migratory-1", "phase": "start",
         "detail": "leader, rolling-restart: 4 of 5"},
        {"time": 11.0, "fault": "stop", "target": "migratory-1", "phase": "end",
         "detail": "exited 0 after 1.00s: leader, rolling-restart: 4 of 5"},
        {"time": 11.0, "fault": "restart", "target": "migratory-1", "phase": "start",
         "detail": "pid 7"},
        {"time": 15.0, "fault": "restart", "target": "migratory-1", "phase": "end",
         "detail": "ready"},
    ]
    leaders = [(9.5, "migratory-1"), (10.75, "migratory-0")]
    elections = leader_elections(faults, leaders)
    assert [(e["target"], e["new_leader"], e["seconds"]) for e in elections["events"]] == [
        ("migratory-1", "migratory-0", 0.75)
    ]
    assert fault_windows(faults, 60.0) == [
        {"start": 10.0, "end": 15.0, "label": "stop migratory-1"}
    ]
