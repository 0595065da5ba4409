"""The safety checks: every name of ``chaos.schema.VIOLATIONS``, per subscriber kind.

Each check is a small query producing rows of one common shape (:data:`COLUMNS`);
the six are unioned, cached once, then counted and sampled with two actions.

- lost: a publish acknowledged ok and not delivered (any type) to a subscriber that
  was subscribed to its subject throughout (``subscribed`` before the invoke, never
  ``unsubscribed``, never denied), unless a ``DATA_RESYNC`` for that subscriber and
  subject skipped over it (same epoch and resync seq >= its seq, or a resync to
  another / no epoch after its invoke).
- unexpected: a delivery whose msg_id was never invoked (or is not ours: null).
- duplicates: one subscriber got one msg_id more than once (snapshots excepted).
- reorders: a subscriber's seq of a subject went down from one delivery to the next
  within an epoch (deliveries in time order, snapshots excepted).
- holes: seqs missing between two delivered seqs of one epoch (snapshots excepted),
  unless a DATA_RESYNC, subscribed or unsubscribed event of that subscriber and
  subject lies between the two deliveries.
- collisions: one (subject, epoch, seq) names two msg_ids across publish acks and
  that kind's deliveries (acks count for every kind).
"""

from __future__ import annotations

from typing import Any

from chaos.schema import VIOLATIONS

from .load import History

Examples = dict[str, dict[str, list[dict[str, Any]]]]

KINDS = ("sdk", "raw")
MAX_EXAMPLES = 20
COLUMNS = ("kind", "violation", "subscriber", "subject", "epoch", "seq", "msg_id", "time", "detail")


def _shape(frame: Any, violation: str, **cols: Any) -> Any:
    """``frame`` projected onto :data:`COLUMNS` (missing ones null, detail a string)."""
    from pyspark.sql import functions as F

    types = {"epoch": "long", "seq": "long", "time": "double"}
    out = []
    for name in COLUMNS:
        if name == "violation":
            out.append(F.lit(violation).alias(name))
        elif name in cols:
            out.append(cols[name].cast(types.get(name, "string")).alias(name))
        elif name in frame.columns:
            out.append(F.col(name).cast(types.get(name, "string")).alias(name))
        else:
            out.append(F.lit(None).cast(types.get(name, "string")).alias(name))
    return frame.select(*out)


def invokes(history: History) -> Any:
    from pyspark.sql import functions as F

    pubs = history["publishes"]
    return (
        pubs.where(F.col("type") == "invoke")
        .groupBy("msg_id")
        .agg(F.min("time").alias("invoke_time"), F.first("subject").alias("invoke_subject"))
    )


def acks(history: History) -> Any:
    from pyspark.sql import functions as F

    pubs = history["publishes"]
    return pubs.where(F.col("type") == "ok").select("msg_id", "subject", "epoch", "seq", "time")


def unexpected(history: History, inv: Any) -> Any:
    from pyspark.sql import functions as F

    dels = history["deliveries"]
    found = dels.join(F.broadcast(inv.select("msg_id")), "msg_id", "left_anti")
    return _shape(found, "unexpected", detail=found["type"])


def duplicates(history: History) -> Any:
    from pyspark.sql import functions as F

    dels = history["deliveries"].where((F.col("type") != "snapshot") & F.col("msg_id").isNotNull())
    found = (
        dels.groupBy("kind", "subscriber", "msg_id")
        .agg(
            F.count("*").alias("n"),
            F.min("time").alias("time"),
            F.first("subject").alias("subject"),
            F.min("seq").alias("seq"),
            F.min("epoch").alias("epoch"),
        )
        .where(F.col("n") > 1)
    )
    return _shape(found, "duplicates", detail=F.concat(F.lit("copies="), F.col("n")))


def reorders(history: History) -> Any:
    from pyspark.sql import Window
    from pyspark.sql import functions as F

    dels = history["deliveries"].where(F.col("type") != "snapshot")
    w = Window.partitionBy("kind", "subscriber", "subject").orderBy("time", "_line")
    found = (
        dels.withColumn("prev_epoch", F.lag("epoch").over(w))
        .withColumn("prev_seq", F.lag("seq").over(w))
        .withColumn("prev_msg", F.lag("msg_id").over(w))
        .where((F.col("prev_epoch") == F.col("epoch")) & (F.col("seq") < F.col("prev_seq")))
    )
    detail = F.concat(
        F.lit("after seq "), F.col("prev_seq"), F.lit(" ("), F.col("prev_msg"), F.lit(")")
    )
    return _shape(found, "reorders", detail=detail)


def _markers(history: History, events: tuple[str, ...]) -> Any:
    from pyspark.sql import functions as F

    subs = history["subscriptions"]
    return subs.where(F.col("event").isin(*events)).select(
        "kind",
        "subscriber",
        "subject",
        F.col("event").alias("m_event"),
        F.col("epoch").alias("m_epoch"),
        F.col("seq").alias("m_seq"),
        F.col("time").alias("m_time"),
    )


def holes(history: History) -> Any:
    from pyspark.sql import Window
    from pyspark.sql import functions as F

    dels = history["deliveries"].where(F.col("type") != "snapshot")
    keys = ["kind", "subscriber", "subject", "epoch"]
    seqs = (
        dels.where(F.col("seq").isNotNull()).groupBy(*keys, "seq").agg(F.min("time").alias("time"))
    )
    w = Window.partitionBy(*keys).orderBy("seq")
    gaps = (
        seqs.withColumn("next_seq", F.lead("seq").over(w))
        .withColumn("next_time", F.lead("time").over(w))
        .where(F.col("next_seq") > F.col("seq") + 1)
    )
    marks = _markers(history, ("DATA_RESYNC", "subscribed", "unsubscribed"))
    lo = F.least(gaps["time"], gaps["next_time"])
    hi = F.greatest(gaps["time"], gaps["next_time"])
    cond = (
        (gaps["kind"] == marks["kind"])
        & (gaps["subscriber"] == marks["subscriber"])
        & (gaps["subject"] == marks["subject"])
        & (marks["m_time"] >= lo)
        & (marks["m_time"] <= hi)
    )
    found = gaps.join(F.broadcast(marks), cond, "left_anti")
    detail = F.concat(F.lit("missing seq "), F.col("seq") + 1, F.lit(".."), F.col("next_seq") - 1)
    return _shape(found, "holes", seq=F.col("seq") + 1, detail=detail)


def lost(history: History, inv: Any, ack: Any) -> Any:
    from pyspark.sql import functions as F

    subs = history["subscriptions"]
    eligible = (
        subs.where(F.col("subject").isNotNull())
        .groupBy("kind", "subscriber", "subject")
        .agg(
            F.min(F.when(F.col("event") == "subscribed", F.col("time"))).alias("first_sub"),
            F.max((F.col("event").isin("unsubscribed", "SUBSCRIBE_DENY")).cast("int")).alias(
                "gone"
            ),
        )
        .where(F.col("first_sub").isNotNull() & (F.col("gone") == 0))
        .select("kind", "subscriber", "subject", "first_sub")
    )
    published = ack.dropDuplicates(["msg_id"]).drop("time").join(inv, "msg_id")
    expected = published.join(F.broadcast(eligible), "subject").where(
        F.col("first_sub") < F.col("invoke_time")
    )
    got = history["deliveries"].select("kind", "subscriber", "msg_id").distinct()
    missing = expected.join(got, ["kind", "subscriber", "msg_id"], "left_anti")
    res = _markers(history, ("DATA_RESYNC",))
    skipped = ((res["m_epoch"] == missing["epoch"]) & (res["m_seq"] >= missing["seq"])) | (
        (res["m_epoch"].isNull() | (res["m_epoch"] != missing["epoch"]))
        & (res["m_time"] >= missing["invoke_time"])
    )
    cond = (
        (missing["kind"] == res["kind"])
        & (missing["subscriber"] == res["subscriber"])
        & (missing["subject"] == res["subject"])
        & skipped
    )
    found = missing.join(F.broadcast(res), cond, "left_anti")
    return _shape(found, "lost", time=F.col("invoke_time"), detail=F.lit("not delivered"))


def collisions(history: History, ack: Any) -> Any:
    from pyspark.sql import functions as F

    spark = history["publishes"].sparkSession
    kinds = spark.createDataFrame([(k,) for k in KINDS], "kind string")
    dels = history["deliveries"]
    extra = dels.select("kind").distinct()
    kinds = kinds.union(extra).distinct()
    positions = ack.crossJoin(kinds).select("kind", "subject", "epoch", "seq", "msg_id", "time")
    positions = positions.unionByName(dels.select(*positions.columns))
    found = (
        positions.where(
            F.col("msg_id").isNotNull() & F.col("epoch").isNotNull() & F.col("seq").isNotNull()
        )
        .groupBy("kind", "subject", "epoch", "seq")
        .agg(
            F.countDistinct("msg_id").alias("n"),
            F.sort_array(F.collect_set("msg_id")).alias("ids"),
            F.min("time").alias("time"),
        )
        .where(F.col("n") > 1)
    )
    return _shape(found, "collisions", detail=F.concat_ws(" vs ", F.col("ids")))


def check(history: History) -> tuple[dict[str, dict[str, int]], Examples]:
    """``(violations, examples)``: counts and up to 20 examples per kind and name."""
    from pyspark.sql import Window
    from pyspark.sql import functions as F

    inv = invokes(history)
    ack = acks(history)
    parts = [
        lost(history, inv, ack),
        unexpected(history, inv),
        duplicates(history),
        reorders(history),
        holes(history),
        collisions(history, ack),
    ]
    found = parts[0]
    for part in parts[1:]:
        found = found.unionByName(part)
    found = found.cache()
    kinds = list(KINDS)
    violations: dict[str, dict[str, int]] = {k: dict.fromkeys(VIOLATIONS, 0) for k in kinds}
    examples: Examples = {k: {v: [] for v in VIOLATIONS} for k in kinds}
    for row in found.groupBy("kind", "violation").count().collect():
        kind = row["kind"] or "unknown"
        violations.setdefault(kind, dict.fromkeys(VIOLATIONS, 0))[row["violation"]] = row["count"]
    if any(n for per in violations.values() for n in per.values()):
        w = Window.partitionBy("kind", "violation").orderBy("time", "subscriber", "seq")
        sample = found.withColumn("_n", F.row_number().over(w)).where(F.col("_n") <= MAX_EXAMPLES)
        for row in sample.orderBy("kind", "violation", "_n").collect():
            kind = row["kind"] or "unknown"
            per = examples.setdefault(kind, {v: [] for v in VIOLATIONS})
            per[row["violation"]].append(
                {c: row[c] for c in COLUMNS if c not in ("kind", "violation")}
            )
    found.unpersist()
    return violations, examples


def unknown_outcome(history: History) -> dict[str, Any]:
    """Publishes whose outcome the publisher never learned (``info``): delivered or not.

    Also counts ``fail`` publishes that were delivered anyway (reported, not a violation).
    """
    from pyspark.sql import functions as F

    pubs = history["publishes"]
    delivered = (
        history["deliveries"]
        .where(F.col("msg_id").isNotNull())
        .groupBy("msg_id")
        .agg(F.min("time").alias("first_delivery"), F.count("*").alias("deliveries"))
    )
    info = (
        pubs.where(F.col("type") == "info")
        .select("msg_id", "subject", "member", "time", "reason")
        .join(delivered, "msg_id", "left")
    )
    rows = info.orderBy("time").collect()
    later = [r for r in rows if r["first_delivery"] is not None]
    never = [r for r in rows if r["first_delivery"] is None]

    def ex(sel: list[Any]) -> list[dict[str, Any]]:
        return [r.asDict() for r in sel[:MAX_EXAMPLES]]

    failed = (
        pubs.where(F.col("type") == "fail").select("msg_id").distinct().join(delivered, "msg_id")
    )
    failed_rows = failed.limit(MAX_EXAMPLES).collect()
    return {
        "count": len(rows),
        "delivered": len(later),
        "not_delivered": len(never),
        "examples_delivered": ex(later),
        "examples_not_delivered": ex(never),
        "failed_but_delivered": failed.count() if failed_rows else 0,
        "examples_failed_but_delivered": [r.asDict() for r in failed_rows],
    }
