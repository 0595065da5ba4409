"""Read a chaos run directory into cached Spark DataFrames, one per history table.

Everything in the run directory (``run.json``, ``schedule.jsonl``, ``history/*.jsonl``)
is read through the Spark session, so ``RUN_DIR`` may be anything its Hadoop file
systems read: a local directory (the default), ``file:///…``, ``hdfs://…``, or
``s3a://…`` when the session has the S3A connector. Only :func:`check_layout`, a fast
check run before the session starts, looks at the local file system, and only for a
local ``RUN_DIR``.

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
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any, TypeVar
from urllib.parse import urlsplit

from chaos.schema import TABLES, spark_schema

T = TypeVar("T")
REQUIRED_NONEMPTY = ("publishes",)
# Per table, the columns whose value counts go into ``counts`` (one action per table
# yields both those counts and the malformed-line tally).
COUNT_KEYS: dict[str, tuple[str, ...]] = {
    "publishes": ("type",),
    "deliveries": ("kind", "type"),
    "subscriptions": ("kind", "event"),
    "nemesis": (),
    "cluster": (),
    "crashes": (),
}


class UnusableInput(Exception):
    """The run directory cannot be analysed; the message says why."""


@dataclass
class History:
    run_dir: str
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


def is_local(run_dir: str) -> bool:
    """A plain path or a ``file:`` URI (as opposed to ``hdfs://``, ``s3a://``, …)."""
    return urlsplit(run_dir).scheme in ("", "file")


def local_path(run_dir: str) -> Path:
    """The local directory of a plain path or ``file:`` URI."""
    parts = urlsplit(run_dir)
    return Path(parts.path) if parts.scheme == "file" else Path(run_dir)


def check_layout(run_dir: str) -> None:
    """Fast check of a local ``RUN_DIR`` before Spark starts: raises
    :class:`UnusableInput` naming every missing file. (Any ``RUN_DIR`` is checked again,
    through Spark, by :func:`load`.)"""
    root = local_path(run_dir)
    if not root.is_dir():
        raise UnusableInput(f"{run_dir}: not a directory")
    missing = [] if (root / "run.json").is_file() else ["run.json"]
    missing += [
        f"history/{t}.jsonl" for t in TABLES if not (root / "history" / f"{t}.jsonl").is_file()
    ]
    if missing:
        raise UnusableInput(f"{run_dir}: missing {', '.join(missing)}")


def _java_reason(exc: Exception) -> str:
    """The JVM exception behind a py4j error (its first line), else the message's."""
    java = getattr(exc, "java_exception", None)
    text = str(java.toString()) if java is not None else str(exc)
    return text.strip().splitlines()[0] if text.strip() else type(exc).__name__


def _through_spark(uri: str, read: Callable[[], T]) -> T | None:
    """``read()``; None when Spark says the path does not exist; any other failure
    (no file system for the scheme, no connector, no access) is unusable input."""
    try:
        return read()
    except Exception as exc:
        condition = getattr(exc, "getCondition", None)
        if callable(condition) and condition() == "PATH_NOT_FOUND":
            return None
        raise UnusableInput(f"{uri}: Spark cannot read it: {_java_reason(exc)}") from exc


def read_text(spark: Any, uri: str) -> str | None:
    """The whole text of one file, read by Spark; None when it does not exist."""
    rows = _through_spark(uri, lambda: spark.read.text(uri, wholetext=True).collect())
    return None if rows is None else "".join(r["value"] for r in rows)


def parse_run(run_dir: str, text: str) -> dict[str, Any]:
    try:
        run = json.loads(text)
    except ValueError as exc:
        raise UnusableInput(f"{run_dir}/run.json: not JSON ({exc})") from exc
    if not isinstance(run, dict):
        raise UnusableInput(f"{run_dir}/run.json: not a JSON object")
    return run


def parse_schedule(text: str | None) -> list[dict[str, Any]] | None:
    """``schedule.jsonl`` (the nemesis plan as generated), or None when absent.

    Its lines are not a history table (no schema in ``chaos.schema``): kept as parsed.
    """
    if text is None:
        return None
    out = []
    for line in text.splitlines():
        try:
            item = json.loads(line)
        except ValueError:
            continue
        if isinstance(item, dict):
            out.append(item)
    return out


def load(spark: Any, run_dir: str) -> History:
    """Every table read with its schema from ``chaos.schema``, cached, malformed dropped.

    ``_line`` (increasing in file order) breaks ties between equal times.
    """
    from pyspark.sql import functions as F

    base = run_dir.rstrip("/")
    run_text = read_text(spark, f"{base}/run.json")
    missing = [] if run_text is not None else ["run.json"]
    raws: dict[str, Any] = {}
    for table in TABLES:
        uri = f"{base}/history/{table}.jsonl"
        reader = spark.read.schema(spark_schema(table)).option("mode", "PERMISSIVE")
        raw = _through_spark(uri, partial(reader.json, uri))
        if raw is None:
            missing.append(f"history/{table}.jsonl")
        else:
            raws[table] = raw
    if run_text is None or missing:
        raise UnusableInput(f"{run_dir}: missing {', '.join(missing)}")
    run = parse_run(run_dir, run_text)
    schedule = parse_schedule(read_text(spark, f"{base}/schedule.jsonl"))
    history = History(run_dir=run_dir, run=run, frames={}, schedule=schedule)
    for table, raw in raws.items():
        raw = raw.withColumn("_line", F.monotonically_increasing_id()).cache()
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
