"""Read a chaos run directory into cached Spark DataFrames, one per history table.

Missing files, an unreadable ``run.json`` or a run without a single publish make the
input unusable (:class:`UnusableInput`, exit code 2). Lines that do not parse as JSON
(a writer killed mid-line) are dropped and counted as ``malformed``.

The JSON lines are parsed once, straight into the in-memory cache: every later query
reads the cache. (Converting to Parquet first was measured and is slower here: on a
5-minute history, JSON -> cache takes 4.5-5 s, JSON -> Parquet -> cache 7.3-7.9 s,
because nothing is read from disk twice.)
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from chaos.schema import TABLES, spark_schema

REQUIRED_NONEMPTY = ("publishes",)
# Per table, the columns whose value counts go into ``counts`` (one action per table
# yields both those counts and the malformed-line tally).
COUNT_KEYS: dict[str, tuple[str, ...]] = {
    "publishes": ("type",),
    "deliveries": ("kind", "type"),
    "subscriptions": ("kind", "event"),
    "nemesis": (),
    "cluster": (),
}


class UnusableInput(Exception):
    """The run directory cannot be analysed; the message says why."""


@dataclass
class History:
    run_dir: Path
    run: dict[str, Any]
    frames: dict[str, Any]  # table name -> cached DataFrame (malformed lines removed)
    rows: dict[str, int] = field(default_factory=dict)
    malformed: dict[str, int] = field(default_factory=dict)
    values: dict[str, list[tuple[tuple[Any, ...], int]]] = field(default_factory=dict)
    schedule: list[dict[str, Any]] | None = None  # schedule.jsonl as generated, if present

    def __getitem__(self, table: str) -> Any:
        return self.frames[table]

    def unpersist(self) -> None:
        for frame in self.frames.values():
            frame.unpersist()


def check_layout(run_dir: Path) -> dict[str, Any]:
    """``run.json`` parsed; raises :class:`UnusableInput` naming every missing piece."""
    if not run_dir.is_dir():
        raise UnusableInput(f"{run_dir}: not a directory")
    run_json = run_dir / "run.json"
    missing = [] if run_json.is_file() else ["run.json"]
    missing += [
        f"history/{t}.jsonl" for t in TABLES if not (run_dir / "history" / f"{t}.jsonl").is_file()
    ]
    if missing:
        raise UnusableInput(f"{run_dir}: missing {', '.join(missing)}")
    try:
        run = json.loads(run_json.read_text())
    except (OSError, ValueError) as exc:
        raise UnusableInput(f"{run_json}: not JSON ({exc})") from exc
    if not isinstance(run, dict):
        raise UnusableInput(f"{run_json}: not a JSON object")
    return run


def read_schedule(run_dir: Path) -> list[dict[str, Any]] | None:
    """``schedule.jsonl`` (the nemesis plan as generated), or None when absent.

    Its lines are not a history table (no schema in ``chaos.schema``): kept as parsed.
    """
    path = run_dir / "schedule.jsonl"
    if not path.is_file():
        return None
    out = []
    for line in path.read_text().splitlines():
        try:
            item = json.loads(line)
        except ValueError:
            continue
        if isinstance(item, dict):
            out.append(item)
    return out


def load(spark: Any, run_dir: Path) -> History:
    """Every table read with its schema from ``chaos.schema``, cached, malformed dropped.

    ``_line`` (increasing in file order) breaks ties between equal times.
    """
    from pyspark.sql import functions as F

    run = check_layout(run_dir)
    history = History(run_dir=run_dir, run=run, frames={}, schedule=read_schedule(run_dir))
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
        keys = COUNT_KEYS[table]
        tally = raw.groupBy(*keys).agg(F.count("*").alias("n"), F.count("time").alias("ok"))
        got = tally.collect()
        history.frames[table] = raw.where(F.col("time").isNotNull())
        history.rows[table] = sum(r["ok"] for r in got)
        history.malformed[table] = sum(r["n"] - r["ok"] for r in got)
        history.values[table] = [(tuple(r[k] for k in keys), r["ok"]) for r in got if r["ok"]]
    for table in REQUIRED_NONEMPTY:
        if history.rows[table] == 0:
            history.unpersist()
            raise UnusableInput(f"{run_dir}: table {table} has no usable rows")
    return history


def counts(history: History) -> dict[str, Any]:
    """Row counts: per table, publishes per type, deliveries and subscription events per
    kind (from the tallies :func:`load` took), subscribers per kind."""
    from pyspark.sql import functions as F

    subscribers = (
        history["subscriptions"]
        .groupBy("kind")
        .agg(F.countDistinct("subscriber").alias("n"))
        .collect()
    )
    pubs = {str(k[0]): n for k, n in history.values["publishes"]}
    dels: dict[str, dict[str, int]] = {}
    for (kind, typ), n in history.values["deliveries"]:
        dels.setdefault(str(kind), {})[str(typ)] = n
    events: dict[str, dict[str, int]] = {}
    for (kind, event), n in history.values["subscriptions"]:
        events.setdefault(str(kind), {})[str(event)] = n
    return {
        "rows": dict(history.rows),
        "malformed_lines": dict(history.malformed),
        "publishes": dict(sorted(pubs.items())),
        "deliveries": {k: dict(sorted(v.items())) for k, v in sorted(dels.items())},
        "subscription_events": {k: dict(sorted(v.items())) for k, v in sorted(events.items())},
        "subscribers": {str(r["kind"]): r["n"] for r in sorted(subscribers, key=str)},
    }
