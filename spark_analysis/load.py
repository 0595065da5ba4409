"""Read a chaos run directory into cached Spark DataFrames, one per history table.

Missing files, an unreadable ``run.json`` or a run without a single publish make the
input unusable (:class:`UnusableInput`, exit code 2). Lines that do not parse as JSON
(a writer killed mid-line) are dropped and counted as ``malformed``.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from chaos.schema import TABLES, spark_schema

REQUIRED_NONEMPTY = ("publishes",)


class UnusableInput(Exception):
    """The run directory cannot be analysed; the message says why."""


@dataclass
class History:
    run_dir: Path
    run: dict[str, Any]
    frames: dict[str, Any]  # table name -> cached DataFrame
    rows: dict[str, int] = field(default_factory=dict)
    malformed: dict[str, int] = field(default_factory=dict)

    def __getitem__(self, table: str) -> Any:
        return self.frames[table]

    def unpersist(self) -> None:
        for frame in self.frames.values():
            frame.unpersist()


def check_layout(run_dir: Path) -> dict[str, Any]:
    """``run.json`` parsed; raises :class:`UnusableInput` naming the first missing piece."""
    if not run_dir.is_dir():
        raise UnusableInput(f"{run_dir}: not a directory")
    run_json = run_dir / "run.json"
    if not run_json.is_file():
        raise UnusableInput(f"{run_json}: missing run.json")
    try:
        run = json.loads(run_json.read_text())
    except (OSError, ValueError) as exc:
        raise UnusableInput(f"{run_json}: not JSON ({exc})") from exc
    if not isinstance(run, dict):
        raise UnusableInput(f"{run_json}: not a JSON object")
    missing = [t for t in TABLES if not (run_dir / "history" / f"{t}.jsonl").is_file()]
    if missing:
        names = ", ".join(f"history/{t}.jsonl" for t in missing)
        raise UnusableInput(f"{run_dir}: missing table(s): {names}")
    return run


def load(spark: Any, run_dir: Path) -> History:
    """Every table read with its schema from ``chaos.schema``, malformed lines dropped.

    ``_line`` (increasing in file order) breaks ties between equal times.
    """
    from pyspark.sql import functions as F

    run = check_layout(run_dir)
    history = History(run_dir=run_dir, run=run, frames={})
    for table in TABLES:
        path = run_dir / "history" / f"{table}.jsonl"
        raw = (
            spark.read.schema(spark_schema(table))
            .option("mode", "PERMISSIVE")
            .json(str(path))
            .withColumn("_line", F.monotonically_increasing_id())
            .cache()
        )
        # A line that is not JSON parses to all-null fields; every real line has a time.
        tally = raw.agg(F.count("*").alias("n"), F.count("time").alias("ok")).collect()[0]
        history.frames[table] = raw.where(F.col("time").isNotNull())
        history.rows[table] = tally["ok"]
        history.malformed[table] = tally["n"] - tally["ok"]
    for table in REQUIRED_NONEMPTY:
        if history.rows[table] == 0:
            history.unpersist()
            raise UnusableInput(f"{run_dir}: table {table} has no usable rows")
    return history


def counts(history: History) -> dict[str, Any]:
    """Row counts: per table, publishes per type, deliveries per kind and type."""
    from pyspark.sql import functions as F

    pubs = history["publishes"].groupBy("type").count().collect()
    dels = history["deliveries"].groupBy("kind", "type").count().collect()
    subscribers = (
        history["subscriptions"]
        .groupBy("kind")
        .agg(F.countDistinct("subscriber").alias("n"))
        .collect()
    )
    by_kind: dict[str, dict[str, int]] = {}
    for r in dels:
        by_kind.setdefault(str(r["kind"]), {})[str(r["type"])] = r["count"]
    return {
        "rows": dict(history.rows),
        "malformed_lines": dict(history.malformed),
        "publishes": {str(r["type"]): r["count"] for r in pubs},
        "deliveries": by_kind,
        "subscribers": {str(r["kind"]): r["n"] for r in subscribers},
    }
