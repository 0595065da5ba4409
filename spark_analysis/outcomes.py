"""Publishes whose outcome the publisher never learned, and failed ones delivered anyway
(reported, not violations)."""

from __future__ import annotations

from typing import Any

from .load import History

MAX_EXAMPLES = 20


def unknown_outcome(history: History) -> dict[str, Any]:
    """Publishes whose outcome the publisher never learned (``info``): delivered or not.

    Also counts ``fail`` publishes that were delivered anyway (reported, not a violation).
    """
    from pyspark.sql import functions as F

    pubs = history["publishes"]
    odd = pubs.where(F.col("type").isin("info", "fail")).select(
        "msg_id", "type", "subject", "member", "time", "reason"
    )
    rows = odd.orderBy("time", "_line").collect()
    delivered = {
        r["msg_id"]: (r["first_delivery"], r["deliveries"])
        for r in history["deliveries"]
        .join(F.broadcast(odd.select("msg_id").distinct()), "msg_id")
        .groupBy("msg_id")
        .agg(F.min("time").alias("first_delivery"), F.count("*").alias("deliveries"))
        .collect()
    }
    return summarise_outcomes([r.asDict() for r in rows], delivered)


def summarise_outcomes(
    rows: list[dict[str, Any]], delivered: dict[str, tuple[float, int]]
) -> dict[str, Any]:
    """Pure part of :func:`unknown_outcome`: info / fail publishes split by delivery."""

    def with_delivery(r: dict[str, Any]) -> dict[str, Any]:
        first, n = delivered.get(r["msg_id"], (None, 0))
        return {**r, "first_delivery": first, "deliveries": n}

    info = [with_delivery(r) for r in rows if r["type"] == "info"]
    later = [r for r in info if r["first_delivery"] is not None]
    never = [r for r in info if r["first_delivery"] is None]
    failed = [with_delivery(r) for r in rows if r["type"] == "fail" and r["msg_id"] in delivered]
    return {
        "count": len(info),
        "delivered": len(later),
        "not_delivered": len(never),
        "examples_delivered": later[:MAX_EXAMPLES],
        "examples_not_delivered": never[:MAX_EXAMPLES],
        "failed_but_delivered": len(failed),
        "examples_failed_but_delivered": failed[:MAX_EXAMPLES],
    }
