"""The local StatefulSet rehearsal (tests/deploy/rehearsal.py) under publish load: first
start, HPA 3 -> 6 -> 3 with the drain, a rolling restart, a seed pod recreated."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent
TIME_SCALE = "0.5"  # the manifest's probe periods, preStop sleep and grace period, halved


@pytest.mark.slow
def test_statefulset_rehearsal_under_load(tmp_path: Path) -> None:
    assert shutil.which("unshare") and shutil.which("nsenter") and shutil.which("ip")
    result = subprocess.run(
        ["unshare", "--net", "--", sys.executable, str(HERE / "rehearsal.py"),
         "--out", str(tmp_path), "--time-scale", TIME_SCALE],
        capture_output=True, text=True, timeout=900,
    )
    summary_path = tmp_path / "summary.json"
    assert summary_path.exists(), result.stdout[-3000:] + result.stderr[-3000:]
    summary = json.loads(summary_path.read_text())
    assert summary["violations"] == [], "\n".join(summary["events"][-30:])
    assert result.returncode == 0
    assert summary["acknowledged"] > 1000
    assert summary["subscribers_moved"] == summary["subscribers"]  # every one moved
    assert summary["data_resync"] == 0 and summary["data_sync"] >= summary["subscribers"]
    phases = [p["phase"] for p in summary["phases"]]
    assert len(phases) == 5, phases
