"""``make serve`` on a fresh machine (README: Python 3.11 and make, nothing else)."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_make_serve_needs_no_npm(tmp_path: Path) -> None:
    """Before: ``make serve`` built the browser files first, with ``npm ci`` -- node >= 20
    and npm, which such a machine lacks: make stopped at 'npm: not found' and never
    served. Now it serves without them (``make js`` builds them; the server says so at
    /client/ and /dashboard/). ``make -n``: what it would run, with no npm on PATH."""
    make = shutil.which("make")
    assert make, "make is needed (README)"
    (tmp_path / "bin").mkdir()
    done = subprocess.run([make, "-n", "serve"], cwd=ROOT, env={"PATH": str(tmp_path / "bin")},
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert [line for line in lines if "npm" in line] == [
        'echo "no npm: the browser client and dashboard are not built (make js: node >= 20)"']
    assert lines[-1].startswith(".venv/bin/migratory serve"), lines
