"""The local StatefulSet rehearsal (tests/deploy/rehearsal.py) under publish load: first
start, HPA 3 -> 6 -> 3 with the drain, a rolling restart, a seed pod recreated."""

from __future__ import annotations

from pathlib import Path

import pytest
from namespaced import run_namespaced


@pytest.mark.slow
def test_statefulset_rehearsal_under_load(tmp_path: Path) -> None:
    result, summary = run_namespaced("rehearsal.py", tmp_path, cpu_limit=200)
    assert summary["violations"] == [], "\n".join(summary["events"][-30:])
    assert result.returncode == 0
    assert summary["acknowledged"] > 1000
    assert summary["subscribers_moved"] == summary["subscribers"]  # every one moved
    assert summary["data_resync"] == 0 and summary["data_sync"] >= summary["subscribers"]
    phases = [p["phase"] for p in summary["phases"]]
    assert len(phases) == 5, phases
