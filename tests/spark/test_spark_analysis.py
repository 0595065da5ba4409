"""spark_analysis against synthetic histories: a correct one, then one planted fault each.

One SparkSession for the module (its start costs ~10 s); every planted variant must be
reported as exactly its own violation, for the sdk subscriber it was planted on.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("pyspark")

import spark_history_gen as gen

from spark_analysis import load, safety
from spark_analysis.__main__ import main

PUBLISHES = 300


@pytest.fixture(scope="module")
def spark() -> Iterator[Any]:
    from spark_analysis.session import spark_session

    session = spark_session("spark-analysis-tests")
    yield session
    session.stop()


def _violations(spark: Any, run_dir: Path) -> tuple[dict[str, dict[str, int]], dict[str, Any]]:
    history = load.load(spark, run_dir)
    try:
        return safety.check(history)
    finally:
        history.unpersist()


def _named(violations: dict[str, dict[str, int]]) -> dict[str, set[str]]:
    return {kind: {n for n, c in per.items() if c} for kind, per in violations.items()}


def test_spark_correct_history_has_no_violation(spark: Any, tmp_path: Path) -> None:
    run_dir = gen.generate(publishes=PUBLISHES).write(tmp_path / "run")
    violations, _ = _violations(spark, run_dir)
    assert _named(violations) == {"sdk": set(), "raw": set()}


PLANTED: list[tuple[Callable[[gen.Synthetic], None], set[str]]] = [
    (gen.plant_lost, {"lost", "holes"}),
    (gen.plant_duplicate, {"duplicates"}),
    (gen.plant_reorder, {"reorders"}),
    (gen.plant_unexpected, {"unexpected"}),
    (gen.plant_collision, {"collisions"}),
    (gen.plant_resync_gap, set()),
]


@pytest.mark.parametrize(("plant", "expected"), PLANTED, ids=[p.__name__ for p, _ in PLANTED])
def test_spark_planted_violation_is_named(
    spark: Any, tmp_path: Path, plant: Callable[[gen.Synthetic], None], expected: set[str]
) -> None:
    syn = gen.generate(publishes=PUBLISHES)
    plant(syn)
    violations, examples = _violations(spark, syn.write(tmp_path / "run"))
    named = _named(violations)
    # Publish acks count for every kind, so a colliding ack shows up for raw as well.
    assert named == {"sdk": expected, "raw": expected & {"collisions"}}
    for name in expected:
        assert violations["sdk"][name] == 1, (name, violations)
        ex = examples["sdk"][name]
        assert len(ex) == 1
        if name != "collisions":
            assert ex[0]["subscriber"] == "s0"
            assert ex[0]["subject"] == "/Chaos/S0"


def test_spark_cli_exit_codes_and_report(spark: Any, tmp_path: Path) -> None:
    good = gen.generate(publishes=PUBLISHES).write(tmp_path / "good")
    assert main([str(good), "--out", str(tmp_path / "rep_good")], spark=spark) == 0
    summary = json.loads((tmp_path / "rep_good" / "summary.json").read_text())
    assert summary["ok"] is True
    assert set(summary) >= {
        "ok",
        "violations",
        "examples",
        "unknown_outcome",
        "failover",
        "latency",
        "counts",
    }
    assert summary["failover"]["leader_election"]["stats"]["count"] == 1
    assert summary["failover"]["publish_unavailability"]["windows"]
    assert summary["latency"]["overall"]["count"] > 0
    assert summary["unknown_outcome"]["count"] > 0
    for name in ("report.md", "latency.png", "throughput.png"):
        assert (tmp_path / "rep_good" / name).stat().st_size > 0
    syn = gen.generate(publishes=PUBLISHES)
    gen.plant_duplicate(syn)
    bad = syn.write(tmp_path / "bad")
    assert main([str(bad), "--out", str(tmp_path / "rep_bad")], spark=spark) == 1
    summary = json.loads((tmp_path / "rep_bad" / "summary.json").read_text())
    assert summary["ok"] is False
    assert summary["violations"]["sdk"]["duplicates"] == 1
    assert "FAIL" in (tmp_path / "rep_bad" / "report.md").read_text()


def test_spark_cli_exit_2_names_missing_table(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    run_dir = gen.generate(publishes=20).write(tmp_path / "run")
    (run_dir / "history" / "deliveries.jsonl").unlink()
    assert main([str(run_dir)]) == 2
    assert "deliveries" in capsys.readouterr().err
    (run_dir / "run.json").unlink()
    assert main([str(run_dir)]) == 2
    assert "run.json" in capsys.readouterr().err
