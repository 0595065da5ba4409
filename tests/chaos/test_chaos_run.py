"""A short real chaos run: every history table written, with the schema's fields."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

from chaos import schema
from chaos.schedule import generate, to_jsonl

ROOT = Path(__file__).resolve().parents[2]


def test_short_run_writes_every_table(tmp_path: Path, light_load: list[str]) -> None:
    out = tmp_path / "run"
    args = [sys.executable, "-m", "chaos", "run", "--seed", "4", "--duration", "15", *light_load]
    started = time.monotonic()
    done = subprocess.run(
        [*args, "--out", str(out)], cwd=ROOT, capture_output=True, text=True, timeout=120
    )
    wall = time.monotonic() - started
    print(done.stdout[-4000:], done.stderr[-4000:])
    assert done.returncode == 0
    assert wall <= 60, f"took {wall:.1f} s"
    run = json.loads((out / "run.json").read_text())
    assert run["seed"] == 4 and run["duration"] == 15
    assert (out / "schedule.jsonl").read_text() == to_jsonl(generate(4, 15))
    for table, fields in schema.TABLES.items():
        lines = (out / "history" / f"{table}.jsonl").read_text().splitlines()
        if table == "crashes":  # written, and empty: no member exited on its own
            assert lines == [], lines
            continue
        assert lines, f"{table} is empty"
        rows = [json.loads(line) for line in lines]
        assert all(list(row) == [name for name, _ in fields] for row in rows), table
        assert {row["run"] for row in rows} == {run["run"]}
    assert run["workload"]["subjects"] == run["subjects"] and len(run["subjects"]) == 10
    assert run["faults"]["applied"] + run["faults"]["skipped"] == run["faults"]["scheduled"]
    assert run["cpu"]["runner_cpu_seconds"] > 0 and run["cpu"]["members_cpu_seconds"] > 0
    publishes = [json.loads(x) for x in (out / "history/publishes.jsonl").open()]
    assert sum(p["type"] == "ok" for p in publishes) > 50
    assert all(p["epoch"] and p["seq"] for p in publishes if p["type"] == "ok")
    ok_by = {p["publisher"] for p in publishes if p["type"] == "ok"}
    assert {"p0", "pr0", "pr1"} <= ok_by, "SDK and raw publishers both acknowledged"
    deliveries = [json.loads(x) for x in (out / "history/deliveries.jsonl").open()]
    assert {d["kind"] for d in deliveries} == {"sdk", "raw"}
    plan = {s["name"]: set(s["subjects"]) for s in run["workload"]["subscribers"]}
    assert all(d["subject"] in plan[d["subscriber"]] for d in deliveries), "subsets only"
    nemesis = [json.loads(x) for x in (out / "history/nemesis.jsonl").open()]
    assert {n["phase"] for n in nemesis} == {"start", "end"}
    assert any(n["fault"] == "kill" for n in nemesis)
    cluster = [json.loads(x) for x in (out / "history/cluster.jsonl").open()]
    assert any(c["raft_state"] == "leader" for c in cluster)
    assert any(not c["up"] for c in cluster), "the sampler saw the killed member down"
    assert "cluster ready" in done.stdout
