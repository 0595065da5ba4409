"""What every real chaos run of the tests must have written: each history table with
the schema's fields, the schedule it ran, the run's own counts. Checked on both real
runs of ``make test`` (the planted-violation run of ``test_chaos_checked.py``, with a
schedule generated from its seed, and the scenario run of ``test_chaos_scenarios.py``,
with a given schedule) instead of on a third run of its own."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from chaos import schema


def rows(out: Path, table: str) -> list[dict[str, Any]]:
    return [json.loads(line) for line in (out / "history" / f"{table}.jsonl").open()]


def check_every_table_written(
    out: Path, *, seed: int, duration: int, schedule: str, crashes: int, stdout: str
) -> None:
    """``out``: the run directory; ``schedule``: the JSON lines it must have run;
    ``crashes``: how many members exited on their own (rows of the crashes table)."""
    run = json.loads((out / "run.json").read_text())
    assert run["seed"] == seed and run["duration"] == duration
    assert (out / "schedule.jsonl").read_text() == schedule
    for table, fields in schema.TABLES.items():
        lines = (out / "history" / f"{table}.jsonl").read_text().splitlines()
        if table == "crashes":  # written, empty when no member exited on its own
            assert len(lines) == crashes, lines
        else:
            assert lines, f"{table} is empty"
        table_rows = [json.loads(line) for line in lines]
        assert all(list(row) == [name for name, _ in fields] for row in table_rows), table
        assert {row["run"] for row in table_rows} == ({run["run"]} if lines else set())
    assert run["workload"]["subjects"] == run["subjects"] and len(run["subjects"]) == 10
    assert run["faults"]["applied"] + run["faults"]["skipped"] == run["faults"]["scheduled"]
    assert run["cpu"]["runner_cpu_seconds"] > 0 and run["cpu"]["members_cpu_seconds"] > 0
    publishes = rows(out, "publishes")
    assert sum(p["type"] == "ok" for p in publishes) > 50
    oks = [p for p in publishes if p["type"] == "ok"]
    # a PUBACK carries no position (the checker takes it from the deliveries)
    assert all(p["epoch"] and p["seq"] for p in oks if not p["publisher"].startswith("pm"))
    assert all(p["epoch"] is p["seq"] is None for p in oks if p["publisher"].startswith("pm"))
    ok_by = {p["publisher"] for p in oks}
    assert {"p0", "pr0", "pr1", "ph0", "pm0"} <= ok_by, "every kind of publisher acknowledged"
    deliveries = rows(out, "deliveries")
    assert {d["kind"] for d in deliveries} == {"sdk", "raw"}
    plan = {s["name"]: set(s["subjects"]) for s in run["workload"]["subscribers"]}
    assert all(d["subject"] in plan[d["subscriber"]] for d in deliveries), "subsets only"
    nemesis = rows(out, "nemesis")
    assert {n["phase"] for n in nemesis} == {"start", "end"}
    assert any(n["fault"] == "kill" for n in nemesis)
    cluster = rows(out, "cluster")
    assert any(c["raft_state"] == "leader" for c in cluster)
    assert any(not c["up"] for c in cluster), "the sampler saw the killed member down"
    assert "cluster ready" in stdout
