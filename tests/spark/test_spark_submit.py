"""The checker through ``spark-submit`` (the one shipped in the pyspark package), the way
docs/chaos.md runs it on a Spark cluster: the project's code shipped as a zip with
``--py-files``, ``spark_analysis/__main__.py`` as the application, RUN_DIR a URI.

Two separate spark-submit processes (each starts its own JVM): a clean history with
spark-submit's master, and a planted crash with this program's ``--master``.
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

ROOT = Path(__file__).resolve().parents[2]
SPARK_SUBMIT = Path(pyspark.__file__).parent / "bin" / "spark-submit"


@pytest.fixture(scope="module")
def code_zip(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The zip docs/chaos.md builds: ``python -m zipfile -c ZIP spark_analysis chaos``."""
    out = tmp_path_factory.mktemp("dist") / "spark_analysis.zip"
    args = [sys.executable, "-m", "zipfile", "-c", str(out), "spark_analysis", "chaos"]
    subprocess.run(args, cwd=ROOT, check=True, timeout=60)
    return out


def spark_submit(
    code_zip: Path, submit_args: list[str], app_args: list[str], cwd: Path
) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ)
    env["PYSPARK_PYTHON"] = sys.executable  # the driver's Python (this venv: matplotlib)
    env["SPARK_CONF_DIR"] = str(ROOT / "spark_analysis" / "conf")  # quiet logs
    args = [str(SPARK_SUBMIT), *submit_args, "--py-files", str(code_zip)]
    # a short-lived JVM on a small history: the C1 JIT alone halves its CPU time
    # (measured: 70 s -> 39 s of CPU per run); nothing the checker does depends on it
    args += ["--driver-java-options", "-XX:TieredStopAtLevel=1"]
    args += [str(ROOT / "spark_analysis" / "__main__.py"), *app_args]
    done = subprocess.run(args, cwd=cwd, env=env, capture_output=True, text=True, timeout=300)
    print(done.stdout[-3000:], done.stderr[-3000:])
    return done


def test_spark_submit_checks_a_history_uri_with_its_own_master(
    code_zip: Path, tmp_path: Path
) -> None:
    uri = gen.generate(publishes=200).write(tmp_path / "run").as_uri()
    report = tmp_path / "report"
    done = spark_submit(
        code_zip, ["--master", "local[1]"], [uri, "--out", str(report)], tmp_path
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert "OK: no safety violation" in done.stdout
    summary = json.loads((report / "summary.json").read_text())
    assert summary["ok"] is True
    assert summary["spark"]["master"] == "local[1]"  # spark-submit's, not our default
    assert summary["counts"]["publishes"]["ok"] == 200
    assert "**PASS**" in (report / "report.md").read_text()


def test_spark_submit_fails_on_a_planted_violation(code_zip: Path, tmp_path: Path) -> None:
    syn = gen.generate(publishes=200)
    gen.plant_crash(syn)
    gen.plant_lost(syn)
    run_dir = syn.write(tmp_path / "run")
    done = spark_submit(code_zip, [], [str(run_dir), "--master", "local[2]"], tmp_path)
    assert done.returncode == 1, done.stderr[-2000:]
    summary = json.loads((run_dir / "report" / "summary.json").read_text())
    assert summary["spark"]["master"] == "local[2]"  # --master of the checker wins
    assert summary["violations"]["members"] == {"unexpected_exits": 1}
    assert summary["violations"]["sdk"]["lost"] == 1
    assert "VIOLATIONS: {'sdk.lost': 1, 'sdk.holes': 1, 'members.unexpected_exits': 1}" in (
        done.stdout
    )
