"""Delivery latency (delivery time - invoke time) and throughput over time.

Latency covers sdk deliveries of type update and recovered (what the application sees
live or after a resume); snapshots and history replays are not latency. Percentiles
are exact enough from ``percentile_approx`` (accuracy 10000).
"""

from __future__ import annotations

from typing import Any

from .load import History

BUCKET = 10.0  # seconds, latency buckets
RATE_BUCKET = 1.0  # seconds, throughput buckets
PCTS = (0.5, 0.9, 0.99)


def _row(pcts: list[float] | None, mx: float | None, n: int) -> dict[str, Any]:
    vals = [round(x * 1000.0, 3) for x in pcts] if pcts else [None, None, None]
    return {
        "count": n,
        "p50_ms": vals[0],
        "p90_ms": vals[1],
        "p99_ms": vals[2],
        "max_ms": round(mx * 1000.0, 3) if mx is not None else None,
    }


def latency(history: History, inv: Any) -> dict[str, Any]:
    from pyspark.sql import functions as F

    dels = history["deliveries"].where(
        (F.col("kind") == "sdk") & F.col("type").isin("update", "recovered")
    )
    lat = (
        dels.join(inv.select("msg_id", "invoke_time"), "msg_id")
        .select("time", (F.col("time") - F.col("invoke_time")).alias("latency"))
        .cache()
    )
    aggs = [
        F.percentile_approx("latency", list(PCTS), 10000).alias("p"),
        F.max("latency").alias("mx"),
        F.count("*").alias("n"),
    ]
    total = lat.agg(*aggs).collect()[0]
    buckets = (
        lat.groupBy((F.floor(F.col("time") / BUCKET) * BUCKET).alias("bucket"))
        .agg(*aggs)
        .orderBy("bucket")
        .collect()
    )
    lat.unpersist()
    return {
        "scope": "sdk deliveries, type update|recovered, delivery time - invoke time",
        "overall": _row(total["p"], total["mx"], total["n"]),
        "bucket_seconds": BUCKET,
        "buckets": [
            {"start": float(b["bucket"]), **_row(b["p"], b["mx"], b["n"])} for b in buckets
        ],
    }


def throughput(history: History) -> dict[str, list[tuple[float, int]]]:
    """Per second: publish oks, and deliveries per kind (all types)."""
    from pyspark.sql import functions as F

    sec = (F.floor(F.col("time") / RATE_BUCKET) * RATE_BUCKET).alias("t")
    oks = history["publishes"].where(F.col("type") == "ok").groupBy(sec).count().collect()
    dels = history["deliveries"].groupBy("kind", sec).count().collect()
    out: dict[str, list[tuple[float, int]]] = {
        "publish_ok": sorted((float(r["t"]), r["count"]) for r in oks)
    }
    for kind in sorted({r["kind"] for r in dels if r["kind"]}):
        out[f"deliveries_{kind}"] = sorted(
            (float(r["t"]), r["count"]) for r in dels if r["kind"] == kind
        )
    return out


def series_end(rates: dict[str, list[tuple[float, int]]]) -> float:
    """End of the last throughput bucket of any series (0 when all are empty)."""
    return max((p[-1][0] + RATE_BUCKET for p in rates.values() if p), default=0.0)
