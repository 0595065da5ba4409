"""``make serve`` on a fresh machine (README: Python 3.11 and make, nothing else)."""

from __future__ import annotations

import os
import shutil
import subprocess
import tomllib
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


def test_make_tests_python_keeps_its_bytecode() -> None:
    """``make test``'s pytest writes bytecode, into the venv, even where the environment
    says PYTHONDONTWRITEBYTECODE=1 (this box's and its CI's did): before, every Python
    process of the suite compiled the project's modules from source again (each xdist
    worker collecting 3,400 tests: 10-11 s of CPU, not 3.5; each member or worker
    started: ~0.12 s more). ``make -n test``: the pytest line, run with ``-c`` instead."""
    make = shutil.which("make")
    assert make, "make is needed (README)"
    env = {**os.environ, "PYTHONDONTWRITEBYTECODE": "1"}
    env.pop("PYTHONPYCACHEPREFIX", None)
    done = subprocess.run([make, "-n", "test"], cwd=ROOT, env=env, capture_output=True,
                          text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    (line,) = [line for line in done.stdout.splitlines() if " -m pytest -n " in line]
    ask = line.split(" -m pytest ")[0] + ' -c "import sys; print(sys.dont_write_bytecode)' \
        ' ; print(sys.pycache_prefix)"'
    asked = subprocess.run(ask, shell=True, cwd=ROOT, env=env, capture_output=True, text=True,
                           timeout=60)
    assert asked.returncode == 0, asked.stderr
    assert asked.stdout.splitlines() == ["False", str(ROOT / ".venv" / "pycache")], line


def test_the_package_metadata_is_what_setuptools_will_keep_building() -> None:
    """``make serve`` printed, twice, a 14-line BuildBackendWarning: "`project.license`
    as a TOML table is deprecated ... By 2027-Feb-18, you need to update your project
    ... or your builds will no longer be supported". The license is an SPDX expression
    now, which needs setuptools 77 (PEP 639) to build."""
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())
    assert project["project"]["license"] == "Apache-2.0"
    assert "setuptools>=77" in project["build-system"]["requires"]
