"""spark_analysis end to end on synthetic histories: a correct run, then one planted fault
each, through the CLI (exit code, summary.json, report.md).

One SparkSession for the module (its start costs ~10 s). Every planted variant must be
reported as exactly its own violation(s), for the kind it was planted on, and nothing else.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("pyspark")

import spark_history_gen as gen

from spark_analysis.__main__ import main

PUBLISHES = 300
NONE: dict[str, set[str]] = {"sdk": set(), "raw": set()}


def _run(spark: Any, syn: gen.Synthetic, tmp_path: Path) -> tuple[int, dict[str, Any], Path]:
    run_dir = syn.write(tmp_path / "run")
    out = tmp_path / "report"
    code = main([str(run_dir), "--out", str(out)], spark=spark)
    return code, json.loads((out / "summary.json").read_text()), out


def _named(summary: dict[str, Any]) -> dict[str, set[str]]:
    return {kind: {n for n, c in per.items() if c} for kind, per in summary["violations"].items()}


def test_spark_correct_history_passes_with_timings(spark: Any, tmp_path: Path) -> None:
    syn = gen.generate(publishes=PUBLISHES)
    code, summary, out = _run(spark, syn, tmp_path)
    assert code == 0
    assert summary["ok"] is True
    assert _named(summary) == NONE
    assert set(summary) == {
        "ok", "run", "violations", "examples", "unknown_outcome", "failover", "latency",
        "counts", "analysis_seconds",
    }  # fmt: skip
    # The resync case is in the history: its skipped messages were really never delivered.
    assert summary["counts"]["subscription_events"]["sdk"]["DATA_RESYNC"] == 2
    assert len(syn.facts["resync_skipped"]) > 2
    fo = summary["failover"]
    (election,) = fo["leader_election"]["events"]
    assert election["target"] == "migratory-0"
    assert election["new_leader"] == "migratory-1"
    assert election["seconds"] == pytest.approx(0.5, abs=0.26)  # one sampling period
    assert fo["subscriber_resume"]["sdk"]["stats"]["count"] == 2
    assert fo["subscriber_resume"]["sdk"]["stats"]["max"] == pytest.approx(1.19, abs=0.01)
    assert fo["subscriber_resume"]["raw"]["stats"]["count"] == 1
    (window,) = fo["publish_unavailability"]["windows"]
    assert window["seconds"] == pytest.approx(1.0, abs=0.02)
    uo = summary["unknown_outcome"]
    assert uo["delivered"] == 1
    assert uo["examples_delivered"][0]["msg_id"] == syn.facts["info_delivered"]
    assert uo["not_delivered"] == uo["count"] - 1 >= 1
    assert uo["failed_but_delivered"] == 0
    lat = summary["latency"]
    assert lat["overall"]["count"] > PUBLISHES
    assert 3.0 <= lat["overall"]["p50_ms"] <= 7.0
    assert lat["overall"]["max_ms"] > 1000  # recovered after the outage
    assert sum(b["count"] for b in lat["buckets"]) == lat["overall"]["count"]
    for name in ("latency.png", "throughput.png"):
        assert (out / name).read_bytes()[:4] == b"\x89PNG"
    md = (out / "report.md").read_text()
    assert "**PASS**" in md
    assert "kill | migratory-0 | start | leader" in md  # the fault schedule as applied


PLANTED: list[tuple[Callable[[gen.Synthetic], None], dict[str, set[str]]]] = [
    (gen.plant_lost, {"sdk": {"lost", "holes"}, "raw": set()}),
    (gen.plant_lost_raw, {"sdk": set(), "raw": {"lost", "holes"}}),
    (gen.plant_duplicate, {"sdk": {"duplicates"}, "raw": set()}),
    (gen.plant_reorder, {"sdk": {"reorders"}, "raw": set()}),
    (gen.plant_unexpected, {"sdk": {"unexpected"}, "raw": set()}),
    # acks count for every kind, and the second message reached the auditors as well
    (gen.plant_collision, {"sdk": {"collisions"}, "raw": {"collisions"}}),
    (gen.plant_resync_gap, NONE),
    (gen.plant_resync_elsewhere, {"sdk": {"lost", "holes"}, "raw": set()}),
]


@pytest.mark.parametrize(("plant", "expected"), PLANTED, ids=[p.__name__ for p, _ in PLANTED])
def test_spark_planted_violation_is_named_alone(
    spark: Any,
    tmp_path: Path,
    plant: Callable[[gen.Synthetic], None],
    expected: dict[str, set[str]],
) -> None:
    syn = gen.generate(publishes=PUBLISHES)
    plant(syn)
    code, summary, out = _run(spark, syn, tmp_path)
    assert _named(summary) == expected
    assert code == (1 if expected != NONE else 0)
    assert summary["ok"] is (expected == NONE)
    for kind, names in expected.items():
        for name in names:
            assert summary["violations"][kind][name] == 1, (kind, name, summary["violations"])
            (ex,) = summary["examples"][kind][name]
            assert ex["subject"] == "/chaos/s0"
            if name != "collisions":
                assert ex["subscriber"] == ("s0" if kind == "sdk" else "a0")
    if expected != NONE:
        md = (out / "report.md").read_text()
        assert "**FAIL**" in md
        assert all(f"### {n} ({k})" in md for k, names in expected.items() for n in names)


def test_spark_malformed_lines_are_counted_not_fatal(spark: Any, tmp_path: Path) -> None:
    syn = gen.generate(publishes=PUBLISHES)
    run_dir = syn.write(tmp_path / "run")
    with (run_dir / "history" / "deliveries.jsonl").open("a") as fh:
        fh.write('{"run": "synthetic", "subscriber": "s0", "ki\n')  # a writer killed mid-line
    code = main([str(run_dir), "--out", str(tmp_path / "report")], spark=spark)
    summary = json.loads((tmp_path / "report" / "summary.json").read_text())
    assert code == 0
    assert summary["counts"]["malformed_lines"]["deliveries"] == 1


def test_spark_cli_exit_2_names_what_is_missing(
    spark: Any, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    run_dir = gen.generate(publishes=20).write(tmp_path / "run")
    (run_dir / "history" / "deliveries.jsonl").unlink()
    (run_dir / "history" / "cluster.jsonl").unlink()
    assert main([str(run_dir)]) == 2  # before any Spark start
    err = capsys.readouterr().err
    assert "history/deliveries.jsonl" in err
    assert "history/cluster.jsonl" in err
    (run_dir / "run.json").unlink()
    assert main([str(run_dir)]) == 2
    assert "run.json" in capsys.readouterr().err
    assert main([str(tmp_path / "nowhere")]) == 2
    # All present, but not one publish can be read.
    run_dir = gen.generate(publishes=20).write(tmp_path / "garbled")
    (run_dir / "history" / "publishes.jsonl").write_text("not json\n")
    assert main([str(run_dir), "--out", str(tmp_path / "r")], spark=spark) == 2
    assert "publishes has no usable rows" in capsys.readouterr().err
