"""Running a deploy rehearsal script in its own network namespace, as the tests do."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
TIME_SCALE = "0.5"  # the manifest's probe periods, preStop sleep and grace period, halved


def run_namespaced(
    script: str, out: Path, timeout: float, *args: str, time_scale: str = TIME_SCALE
) -> tuple[subprocess.CompletedProcess[str], dict[str, Any]]:
    """Run ``tests/deploy/<script> *args`` under ``unshare --net`` with ``--out out``;
    its result and the ``summary.json`` it wrote (asserted to exist)."""
    assert shutil.which("unshare") and shutil.which("nsenter") and shutil.which("ip")
    result = subprocess.run(
        ["unshare", "--net", "--", sys.executable, str(HERE / script), *args,
         "--out", str(out), "--time-scale", time_scale],
        capture_output=True, text=True, timeout=timeout,
    )
    summary_path = out / "summary.json"
    assert summary_path.exists(), result.stdout[-3000:] + result.stderr[-3000:]
    summary: dict[str, Any] = json.loads(summary_path.read_text())
    return result, summary
