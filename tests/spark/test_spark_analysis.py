"""spark_analysis end to end on synthetic histories: a correct run, then every planted
fault in one run (each in its own namespace), through the CLI (exit code, summary.json,
report.md).

One SparkSession for the session (its start costs ~10 s), and as few analyses as the
checks allow (each costs several seconds on 2 cores). Every planted variant must be
reported as exactly its own violation(s), for the kind it was planted on, and nothing else.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("pyspark")

import spark_history_gen as gen
import spark_history_kinds as kinds
from process_tree import CpuBound, run_within

from spark_analysis.__main__ import main

PUBLISHES = 300
NONE: dict[str, set[str]] = {"sdk": set(), "raw": set(), "members": set()}
WHO = {"sdk": "s0", "raw": "a0", "mqtt": "m0", "sse": "e0"}  # where each kind's plants go
REFUSED_MASTER = CpuBound("spark_analysis", cpu_limit=30.0)
"""The checker whose JVM refuses its --master, and the JVM: ~5 s of CPU whatever the load
(24 s of call at load 16; 22 s in CI); more is a loop, less than 1 s in 90 a hang (it had
300 s of wall time)."""


def _named(summary: dict[str, Any]) -> dict[str, set[str]]:
    return {kind: {n for n, c in per.items() if c} for kind, per in summary["violations"].items()}


def test_spark_correct_history_with_a_member_crash(spark: Any, tmp_path: Path) -> None:
    """A correct history in which a member exited on its own: that crash, with its log,
    is the run's one violation (exit 1), the safety checks find nothing; a line torn at
    its end (a writer killed mid-line) is counted, not fatal. (The crash had an analysis
    of its own, ~6 s of JVM CPU; a clean run's exit 0: test_chaos_scenarios.py.)"""
    syn = gen.generate(publishes=PUBLISHES)
    gen.plant_crash(syn)
    run_dir = syn.write(tmp_path / "run")
    with (run_dir / "history" / "deliveries.jsonl").open("a") as fh:
        fh.write('{"run": "synthetic", "subscriber": "s0", "ki\n')  # a writer killed mid-line
    out = tmp_path / "report"
    code = main([str(run_dir), "--out", str(out)], spark=spark)
    summary = json.loads((out / "summary.json").read_text())
    assert code == 1 and summary["ok"] is False
    assert _named(summary) == {**NONE, "members": {"unexpected_exits"}}
    assert summary["counts"]["malformed_lines"]["deliveries"] == 1
    assert set(summary) == {
        "ok", "run", "violations", "examples", "unknown_outcome", "failover", "latency",
        "counts", "spark", "analysis_seconds",
    }  # fmt: skip
    assert summary["violations"]["members"] == {"unexpected_exits": 1}
    assert summary["counts"]["rows"]["crashes"] == 1
    (crash,) = summary["examples"]["members"]["unexpected_exits"]
    assert crash["member"] == "migratory-2"
    assert crash["exit_status"] == 1 and crash["pid"] == 4343
    assert crash["time"] == pytest.approx(syn.facts["crash_time"])
    assert crash["log_tail"].endswith("older than applied 14048")
    assert summary["spark"]["master"] == "local[2]"
    # AQE off on a local master: with it, the planted history's safety check (one query
    # of a few dozen stages) was re-planned and re-described after each stage (84 s -> 50 s)
    assert summary["spark"]["adaptive"] == "false"
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
    assert "**FAIL** — unexpected_exits (members: 1)\n" in md  # nothing else
    assert "| unexpected_exits | - | - | 1 |" in md
    assert "migratory-2 (pid 4343) exited on its own with status 1" in md
    assert "ValueError: sync at clsn 13110 is older than applied 14048\n```" in md
    assert "kill | migratory-0 | start | leader" in md  # the fault schedule as applied


PLANTED: list[tuple[Callable[[gen.Synthetic], None], dict[str, set[str]]]] = [
    (gen.plant_lost, {**NONE, "sdk": {"lost", "holes"}}),
    (gen.plant_lost_raw, {**NONE, "raw": {"lost", "holes"}}),
    (gen.plant_duplicate, {**NONE, "sdk": {"duplicates"}}),
    (gen.plant_reorder, {**NONE, "sdk": {"reorders"}}),
    (gen.plant_unexpected, {**NONE, "sdk": {"unexpected"}}),
    # acks count for every kind (mqtt and sse too: the merged run has their deliveries),
    # and the second message reached the auditors as well
    (gen.plant_collision, {**NONE, "sdk": {"collisions"}, "raw": {"collisions"},
                           "mqtt": {"collisions"}, "sse": {"collisions"}}),
    (gen.plant_resync_gap, NONE),
    (gen.plant_resync_twice, NONE),
    (gen.plant_resync_elsewhere, {**NONE, "sdk": {"lost", "holes"}}),
    (gen.plant_resync_unnumbered, NONE),
    # persistent MQTT sessions: replays at a resume, a QoS 0 loss, a resync are allowed
    (kinds.plant_mqtt_allowed, {**NONE, "mqtt": set()}),
    (kinds.plant_mqtt_lost, {**NONE, "mqtt": {"lost"}}),
    (kinds.plant_mqtt_duplicate, {**NONE, "mqtt": {"duplicates"}}),
    (kinds.plant_mqtt_reorder, {**NONE, "mqtt": {"reorders"}}),
    (kinds.plant_mqtt_resync_before_anything, {**NONE, "mqtt": set()}),
    (kinds.plant_mqtt_resync_after_an_unacknowledged_message, {**NONE, "mqtt": set()}),
    # ... a resync with no snapshot (an empty RETAIN) excuses its own subject only
    (kinds.plant_mqtt_reset_on_a_live_session, {**NONE, "mqtt": set()}),
    (kinds.plant_mqtt_reset_of_another_subject, {**NONE, "mqtt": {"lost"}}),
    # Server-Sent Events streams: the native rules (positions in their events' ids)
    (kinds.plant_sse_lost, {**NONE, "sse": {"lost", "holes"}}),
    (kinds.plant_sse_resync, NONE),
    # acks without a position (MQTT publishers'): positions from the deliveries
    (kinds.plant_positionless_ack_resync, NONE),
    (kinds.plant_positionless_ack_lost, {**NONE, "sdk": {"lost", "holes"}}),
    (kinds.plant_positionless_ack_skipped_by_all, NONE),
    (kinds.plant_positionless_ack_skipped_by_all_but_one, {**NONE, "sdk": {"lost", "holes"}}),
    # ... and nobody got it: its position bounded by the order of events
    (kinds.plant_positionless_ack_resynced_over_everywhere, NONE),
    (kinds.plant_positionless_ack_resynced_over_but_one, {**NONE, "sdk": {"lost", "holes"}}),
]


def test_spark_every_planted_violation_is_named_alone(spark: Any, tmp_path: Path) -> None:
    """Every plant in its own namespace of one run (one Spark job instead of one each):
    each is reported as exactly its own violation(s), once, where it was planted, and
    nothing else is found in its namespace (the resync gap: nothing at all). The run dir
    is given as a URI: everything is read through Spark, the report goes to the local
    directory's report/ (the default --out)."""
    histories = []
    for plant, _ in PLANTED:
        syn = gen.generate(publishes=PUBLISHES)
        plant(syn)
        histories.append(gen.in_namespace(syn, plant.__name__))
    run = gen.merged(histories)
    uri = run.write(tmp_path / "run").as_uri()
    assert uri.startswith("file:///")
    code = main([uri], spark=spark)
    out = tmp_path / "run" / "report"
    summary = json.loads((out / "summary.json").read_text())
    assert code == 1 and summary["ok"] is False
    assert summary["run"] == run.run  # run.json, read through Spark
    kinds = (*WHO, "members")
    found: dict[str, dict[str, set[str]]] = {
        plant.__name__: {kind: set() for kind in kinds} for plant, _ in PLANTED
    }
    for kind in WHO:
        for name, examples in summary["examples"][kind].items():
            assert len(examples) == summary["violations"][kind][name] < 20  # every one listed
            for ex in examples:
                tag = ex["subject"].split("/")[1]
                assert ex["subject"] == f"/{tag}/chaos/s0", ex
                if name != "collisions":
                    assert ex["subscriber"] == f"{tag}:{WHO[kind]}", ex
                assert name not in found[tag][kind], ("more than once", tag, kind, name, ex)
                found[tag][kind].add(name)
    assert found == {p.__name__: {k: set() for k in kinds} | e for p, e in PLANTED}
    assert summary["violations"]["members"] == {"unexpected_exits": 0}
    # an MQTT subscriber has resumed at its next CONNACK (SERVER_UP): no DATA_SYNC in MQTT
    assert "holes" not in summary["violations"]["mqtt"]  # not checked: "-" in the report
    # mqtt, raw, sdk, sse, members
    holes = [sum("holes" in e.get(k, ()) for _, e in PLANTED) for k in ("raw", "sdk", "sse")]
    assert "\n| holes | - | {} | {} | {} | - |\n".format(*holes) in (out / "report.md").read_text()
    mqtt_resumes = summary["failover"]["subscriber_resume"]["mqtt"]
    # one resume per plant with an mqtt subscriber m0 (spark_history_kinds.add_mqtt)
    with_m0 = sum("mqtt" in p.__name__ or "skipped_by_all" in p.__name__ for p, _ in PLANTED)
    assert with_m0 == 10
    assert (mqtt_resumes["stats"]["count"], mqtt_resumes["never_resumed"]) == (with_m0, 0)
    md = (out / "report.md").read_text()
    assert "**FAIL**" in md
    assert "faults planned (schedule.jsonl)" in md  # schedule.jsonl, read through Spark
    for _, expected in PLANTED:
        assert all(f"### {n} ({k})" in md for k, names in expected.items() for n in names)


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


def test_spark_cli_an_out_it_cannot_make_is_exit_2_before_spark(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Before: Spark started, the analysis ran, then a NotADirectoryError traceback."""
    run_dir = gen.generate(publishes=5).write(tmp_path / "run")
    (tmp_path / "file").write_text("")
    out = tmp_path / "file" / "report"
    assert main([str(run_dir), "--out", str(out)]) == 2  # (no session: none is started)
    assert capsys.readouterr().err == f"spark_analysis: --out {out}: Not a directory\n"


def test_spark_cli_a_master_spark_refuses_is_exit_2_in_one_line(tmp_path: Path) -> None:
    """Before: a PySparkRuntimeError traceback, exit 1 (the JVM says why on its own line:
    'Master must either be yarn or start with spark, k8s, or local'). In a process of
    its own: in this one, a Spark session another test started would be handed back
    whatever the --master (exit 0), and stopped at the end under the next test."""
    run_dir = gen.generate(publishes=5).write(tmp_path / "run")
    code, _, stderr = run_within(
        [sys.executable, "-m", "spark_analysis", str(run_dir), "--out", str(tmp_path / "r"),
         "--master", "bogus://x"], REFUSED_MASTER, tmp_path,
    )
    assert code == 2, stderr[-2000:]
    assert "Traceback" not in stderr
    assert "spark_analysis: Spark did not start (--master bogus://x): " in stderr, stderr[-2000:]


# ---- RUN_DIR as a URI: everything read through Spark ----


def test_spark_load_names_every_missing_file_through_spark(spark: Any, tmp_path: Path) -> None:
    from spark_analysis.load import UnusableInput, load

    run_dir = gen.generate(publishes=20).write(tmp_path / "run")
    (run_dir / "run.json").unlink()
    (run_dir / "history" / "crashes.jsonl").unlink()
    (run_dir / "schedule.jsonl").unlink()  # optional: not named
    with pytest.raises(UnusableInput) as info:
        load(spark, run_dir.as_uri())
    assert str(info.value).endswith("missing run.json, history/crashes.jsonl")


def test_spark_a_uri_spark_cannot_read_is_unusable_input(
    spark: Any, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["s3a://no-such-bucket/run", "--out", str(tmp_path / "r")], spark=spark) == 2
    err = capsys.readouterr().err
    assert "s3a://no-such-bucket/run/run.json: Spark cannot read it" in err
    assert "S3AFileSystem not found" in err  # this Spark has no S3A connector
    with pytest.raises(SystemExit) as exit_info:
        main(["hdfs://namenode/runs/r1"], spark=spark)
    assert exit_info.value.code == 2
    assert "--out REPORT_DIR is needed: hdfs://namenode/runs/r1 is not a local" in (
        capsys.readouterr().err
    )
