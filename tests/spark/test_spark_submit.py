"""The checker through ``spark-submit`` (the one shipped in the pyspark package), the way
docs/chaos.md runs it on a Spark cluster: the project's code shipped as a zip with
``--py-files``, ``spark_analysis/__main__.py`` as the application, RUN_DIR a URI.

One spark-submit (its own JVM, ~40 s of CPU) as docs/chaos.md's step 3 runs it:
spark-submit's ``--master``, the checker given none, a planted crash and lost message.
Which master wins when both are given, and a local master's settings under spark-submit,
are tests/spark/test_session.py's (no JVM); exit 0 and a PASS report,
test_spark_analysis.py's (the same ``main``).

Its wait is bounded by what it uses, not by the wall clock: the run is ~40 s of CPU,
whose wall time is the box's load (95 s at load 15-22; more than 300 s in a CI run at load > 20).
It fails on a loop or a hang (:data:`BOUND`, tests/process_tree.py).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("pyspark")

import pyspark
import spark_history_gen as gen
from process_tree import CpuBound, wait_within

ROOT = Path(__file__).resolve().parents[2]
SPARK_SUBMIT = Path(pyspark.__file__).parent / "bin" / "spark-submit"


@pytest.fixture(scope="module")
def code_zip(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The zip docs/chaos.md builds: ``python -m zipfile -c ZIP spark_analysis chaos``."""
    out = tmp_path_factory.mktemp("dist") / "spark_analysis.zip"
    args = [sys.executable, "-m", "zipfile", "-c", str(out), "spark_analysis", "chaos"]
    subprocess.run(args, cwd=ROOT, check=True, timeout=60)
    return out


BOUND = CpuBound("spark-submit", cpu_limit=120.0)
"""spark-submit and everything under it: ~40-44 s of CPU a run whatever the load
(27a1cbe: 43.6 s at load 19-27; 40.1 s at load 15-22), more is a loop, not a slow box;
less than 1 s in 90 is a hang (a JVM or driver waiting on nothing: at load 30 on 2 cores
a busy JVM gets ~6 % of a core, 5 s in 90)."""


def spark_submit(code_zip: Path, submit_args: list[str], app_args: list[str],
                 cwd: Path) -> tuple[subprocess.Popen[bytes], Path, Path]:
    """Start spark-submit (its own JVM), its output to files; :func:`finished` waits."""
    env = dict(os.environ)
    env["PYSPARK_PYTHON"] = sys.executable  # the driver's Python (this venv: matplotlib)
    env["SPARK_CONF_DIR"] = str(ROOT / "spark_analysis" / "conf")  # quiet logs
    args = [str(SPARK_SUBMIT), *submit_args, "--py-files", str(code_zip)]
    # a short-lived JVM on a small history: the C1 JIT alone halves its CPU time
    # (measured: 70 s -> 39 s of CPU per run), the serial collector spares G1's GC
    # threads; nothing the checker does depends on either (tests/conftest.py)
    args += ["--driver-java-options", "-XX:TieredStopAtLevel=1 -XX:+UseSerialGC"]
    args += [str(ROOT / "spark_analysis" / "__main__.py"), *app_args]
    out, err = cwd / "spark-submit.out", cwd / "spark-submit.err"
    with out.open("wb") as stdout, err.open("wb") as stderr:
        proc = subprocess.Popen(args, cwd=cwd, env=env, stdout=stdout, stderr=stderr)
    return proc, out, err


def finished(proc: subprocess.Popen[bytes], out: Path, err: Path) -> tuple[int, str, str]:
    """Its exit status and output once it ends, within :data:`BOUND` (it had 300 s of
    wall time, which a CI run at load > 20 passed)."""
    try:
        wait_within(proc, BOUND)
    finally:
        stdout, stderr = out.read_text(errors="replace"), err.read_text(errors="replace")
        print(stdout[-3000:], stderr[-3000:])
    return proc.returncode, stdout, stderr


def test_spark_submit_names_the_violations_of_a_planted_history(
    code_zip: Path, tmp_path: Path
) -> None:
    """A planted crash and lost message, the run directory given as a URI, checked on
    spark-submit's master: exit 1, both named, the report in --out.

    (Was two spark-submits at once, ~88 s of CPU: this one, with the checker's
    ``--master``, and a clean history on spark-submit's master; CI of 4a748ae: 125 s of
    the spark scope's 363 s.)"""
    syn = gen.generate(publishes=200)
    gen.plant_crash(syn)
    gen.plant_lost(syn)
    planted = syn.write(tmp_path / "planted").as_uri()
    report = tmp_path / "report"
    started = spark_submit(
        code_zip, ["--master", "local[1]"], [planted, "--out", str(report)], tmp_path
    )
    code, out, err = finished(*started)

    assert code == 1, err[-2000:]
    summary = json.loads((report / "summary.json").read_text())
    assert summary["spark"]["master"] == "local[1]"  # spark-submit's, not our default
    assert summary["spark"]["adaptive"] == "false"  # a local master: no AQE (session.py)
    assert summary["counts"]["publishes"]["ok"] == 200
    assert summary["violations"]["members"] == {"unexpected_exits": 1}
    assert summary["violations"]["sdk"]["lost"] == 1
    assert "VIOLATIONS: {'sdk.lost': 1, 'sdk.holes': 1, 'members.unexpected_exits': 1}" in out
    assert "**FAIL**" in (report / "report.md").read_text()
