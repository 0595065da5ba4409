"""Running a deploy rehearsal script in its own network namespace, as the tests do."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

from process_tree import CpuBound, run_within

HERE = Path(__file__).resolve().parent
TIME_SCALE = "0.5"  # the manifest's probe periods, preStop sleep and grace period, halved


PLAY_SILENCE = 150.0
"""Seconds a play may go without a line: each notes what it does as it does it (at most
4 s apart in the rehearsal and seed_restarts.py, load 12-15) but for a pod's readiness,
which it waits for 90 s at most (its own wall bound, then it ends)."""


def run_namespaced(
    script: str, out: Path, cpu_limit: float, *args: str, time_scale: str = TIME_SCALE
) -> tuple[subprocess.CompletedProcess[str], dict[str, Any]]:
    """Run ``tests/deploy/<script> *args`` under ``unshare --net`` with ``--out out``;
    its result and the ``summary.json`` it wrote (asserted to exist). The play and its
    pods may use ``cpu_limit`` s of CPU (more is a loop) and go PLAY_SILENCE s without a
    line (longer is a hang), whatever the wall time a loaded box makes of them
    (tests/process_tree.py); then they are killed and the test fails."""
    assert shutil.which("unshare") and shutil.which("nsenter") and shutil.which("ip")
    out.mkdir(parents=True, exist_ok=True)
    command = ["unshare", "--net", "--", sys.executable, str(HERE / script), *args,
               "--out", str(out), "--time-scale", time_scale]
    bound = CpuBound(Path(script).stem, cpu_limit, stall_seconds=PLAY_SILENCE)
    code, stdout, stderr = run_within(command, bound, out, says=True)
    summary_path = out / "summary.json"
    assert summary_path.exists(), stdout[-3000:] + stderr[-3000:]
    summary: dict[str, Any] = json.loads(summary_path.read_text())
    return subprocess.CompletedProcess(command, code, stdout, stderr), summary
