"""spark_analysis on a Standard run (run.json mode Standard: spark_analysis/standard.py):
a correct history with what Standard legitimately does passes, and each planted
violation is named alone, where it was planted (one Spark analysis for all)."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("pyspark")

import spark_history_gen as gen
import spark_history_standard as std

from spark_analysis.__main__ import main

NONE: dict[str, set[str]] = {"sdk": set(), "raw": set()}


def _named(summary: dict[str, Any]) -> dict[str, set[str]]:
    return {kind: {n for n, c in per.items() if c}
            for kind, per in summary["violations"].items() if kind != "members"}


def test_the_standard_history_holds_what_standard_legitimately_does() -> None:
    """The correct history (checked clean below, as the plant ``nothing_planted``) has
    each thing in it: a message delivered twice to one subscriber, once per lineage; the
    forward gap announced; the message lost with its killed sender, delivered nowhere."""
    syn = std.generate()
    late = [d for d in std.deliveries(syn, "s1") if d["msg_id"] == f"p1-{std.LATE}"]
    assert [d["epoch"] for d in late] == [2000, std.RESYNCED]
    resyncs = [r for r in syn.tables["subscriptions"] if r["event"] == "DATA_RESYNC"]
    assert {(r["subscriber"], r["epoch"]) for r in resyncs} == {("a0", std.RESYNCED),
                                                                ("s1", std.RESYNCED)}
    assert not any(d["msg_id"] == f"p1-{std.DEAD}" for d in syn.tables["deliveries"])
    assert not any(d["msg_id"] == f"p0-{std.GAP}" and d["member"] == std.MEMBERS[2]
                   for d in syn.tables["deliveries"])


PLANTED: list[tuple[Callable[[gen.Synthetic], None], dict[str, set[str]]]] = [
    (std.nothing_planted, NONE),
    (std.plant_lost_on_own_member, {**NONE, "sdk": {"lost"}}),
    (std.plant_silent_forward_gap, {**NONE, "raw": {"lost"}}),
    # the two the rules of h103 let pass: any later DATA_RESYNC announced a forward's loss,
    # and a sender's kill excused it for ever
    (std.plant_forward_gap_announced_late, {**NONE, "raw": {"lost"}}),
    (std.plant_forward_gap_announced_early, {**NONE, "raw": {"lost"}}),
    (std.plant_sender_back_unannounced, {"sdk": {"lost"}, "raw": {"lost"}}),
    (std.plant_hole_before_an_announced_gap, {**NONE, "raw": {"holes", "lost"}}),
    (std.plant_duplicate_in_one_epoch, {**NONE, "sdk": {"duplicates"}}),
    (std.plant_reorder, {**NONE, "sdk": {"reorders"}}),
    (std.plant_unexpected, {**NONE, "sdk": {"unexpected"}}),
    # acks count for every kind (as in Guaranteed): two msg_ids acknowledged at one position;
    # the second one was forwarded nowhere, and no resync came before p0's next messages
    (std.plant_collision, {"sdk": {"collisions", "lost"}, "raw": {"collisions", "lost"}}),
]


def test_standard_every_planted_violation_is_named_alone(spark: Any, tmp_path: Path) -> None:
    """One analysis of every plant in its own namespace: each named as exactly its own
    violation(s), once; the history without a plant is clean (what Standard does
    legitimately is no violation: its resyncs, a repeat in another lineage, a forward lost
    with its sender)."""
    histories = []
    for plant, _ in PLANTED:
        syn = std.generate()
        plant(syn)
        histories.append(gen.in_namespace(syn, plant.__name__))
    run = gen.merged(histories)
    code = main([str(run.write(tmp_path / "run")), "--out", str(tmp_path / "report")],
                spark=spark)
    summary = json.loads((tmp_path / "report" / "summary.json").read_text())
    assert code == 1
    found: dict[str, dict[str, set[str]]] = {p.__name__: {"sdk": set(), "raw": set()}
                                             for p, _ in PLANTED}
    for kind in ("sdk", "raw"):
        for name, examples in summary["examples"][kind].items():
            assert len(examples) == summary["violations"][kind][name]
            for ex in examples:
                tag = ex["subject"].split("/")[1]
                assert name not in found[tag][kind], ("more than once", tag, kind, name, ex)
                found[tag][kind].add(name)
    assert found == {p.__name__: expected for p, expected in PLANTED}
