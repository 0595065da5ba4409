"""The rules of a Standard cluster's run (``run.json`` ``mode`` Standard), where they differ
from Guaranteed's (:mod:`spark_analysis.safety`; the others hold as they are).

In Standard (docs/cluster.md, "Standard mode") each member numbers every message it
publishes -- its clients' and its peers' forwards -- in its own lineage of the subject:
its own random epoch per subject, seq + 1 per message. ``PUBLISH_OK`` carries the
position on the publisher's member; a subscriber of another member gets the same message
at that member's position, or misses it (a forward is best effort) and is then told with
a ``DATA_RESYNC`` (a forward gap, ``cluster/standard_lineage.py``). A subscriber that
fails over to another member gets that member's snapshot and ``DATA_RESYNC``.

A subscriber's *lineage* of a subject at time t is the epoch of its last position before
t (a delivered update or recovered message, or a status carrying a position:
:func:`lineages`). The rules:

- reorders, holes, collisions, unexpected: as in Guaranteed, per epoch -- an epoch is one
  member's lineage of a subject, its positions contiguous and never given twice.
- duplicates: one subscriber got one msg_id twice **within one epoch** of a subject. A
  message may come again in another lineage (a subscriber that failed over to a member
  the message's forward reached late): Standard promises no duplicate on one connection,
  and a connection's lineage changes only with a ``DATA_RESYNC``.
- lost: a publish acknowledged on member M, invoked after S subscribed to its subject (S
  subscribed throughout, as in Guaranteed), never delivered to S, and not announced:

  - *owed by position*: S's lineage at the invoke, or at the ack, was the ack's epoch (S
    followed M's numbering of the subject): announced only by a skip covering the ack's
    position, as in Guaranteed -- M fanned the message out to S, or S resumed from
    before it;
  - *owed by forwarding*: S followed another lineage then: announced by any
    ``DATA_RESYNC`` of the subject to S after the invoke. Not owed when M (the ack's
    member, or the member whose deliveries carry the ack's epoch) was ended after the
    invoke -- killed, stopped, left, crashed: a forward dies with its sender's queue, and
    only its next forward of the subject would show the loss.
"""

from __future__ import annotations

from typing import Any

from .load import History

MODE = "Standard"
ENDINGS = ("kill", "stop", "leave")
NEVER = float("inf")


def is_standard(history: History) -> bool:
    return (history.run or {}).get("mode") == MODE


def lineages(history: History, position_statuses: tuple[str, ...],
             position_deliveries: tuple[str, ...]) -> Any:
    """``(kind, subscriber, subject, l_epoch, l_from, l_to)``: each stretch of time during
    which a subscriber's position of a subject stayed in one epoch, from its first
    position there to the first position in the next (``l_to`` infinite for the last)."""
    from pyspark.sql import Window
    from pyspark.sql import functions as F

    keys = ["kind", "subscriber", "subject"]
    dels = (
        history["deliveries"]
        .where(F.col("type").isin(*position_deliveries) & F.col("epoch").isNotNull())
        .select(*keys, "epoch", "time", "_line", F.lit(0).alias("ord"))
    )
    subs = (
        history["subscriptions"]
        .where(F.col("event").isin(*position_statuses) & F.col("epoch").isNotNull()
               & F.col("subject").isNotNull())
        .select(*keys, "epoch", "time", "_line", F.lit(1).alias("ord"))
    )
    order = Window.partitionBy(*keys).orderBy("time", "ord", "_line")
    stream = dels.unionByName(subs).withColumn("prev", F.lag("epoch").over(order))
    starts = F.when(F.col("prev").isNull() | (F.col("prev") != F.col("epoch")), 1).otherwise(0)
    runs = stream.withColumn(
        "run_no", F.sum(starts).over(order.rowsBetween(Window.unboundedPreceding, 0))
    )
    spans = runs.groupBy(*keys, "run_no").agg(
        F.first("epoch").alias("l_epoch"), F.min("time").alias("l_from")
    )
    after = Window.partitionBy(*keys).orderBy("l_from")
    return spans.select(
        *keys, "l_epoch", "l_from",
        F.coalesce(F.lead("l_from").over(after), F.lit(NEVER)).alias("l_to"),
    )


def origins(history: History, ack: Any) -> Any:
    """``(msg_id, origin)``: the members an acknowledged message was numbered by -- the
    ack's member, and every member whose deliveries carry the ack's epoch of its subject."""
    from pyspark.sql import functions as F

    owners = (
        history["deliveries"].where(F.col("member").isNotNull())
        .select("subject", "epoch", F.col("member").alias("origin")).distinct()
    )
    by_epoch = ack.join(owners, ["subject", "epoch"]).select("msg_id", "origin")
    by_ack = ack.where(F.col("member").isNotNull()).select(
        "msg_id", F.col("member").alias("origin"))
    return by_epoch.unionByName(by_ack).distinct()


def endings(history: History) -> Any:
    """``(origin, ended)``: when each member was ended (a kill, stop or leave as it
    started, a crash as the runner saw it)."""
    from pyspark.sql import functions as F

    faults = history["nemesis"].where(
        F.col("fault").isin(*ENDINGS) & (F.col("phase") == "start")
    ).select(F.col("target").alias("origin"), F.col("time").alias("ended"))
    crashes = history["crashes"].select(F.col("member").alias("origin"),
                                        F.col("time").alias("ended"))
    return faults.unionByName(crashes)


def lost(history: History, inv: Any, ack: Any, skip: Any, expected: Any,
         spans: Any) -> Any:
    """The acknowledged messages a subscriber was owed and never got nor was told of
    (module docstring). ``expected``: acks joined with the subscribers subscribed
    throughout to their subject before their invoke (``safety.lost``'s), ``skip``: the
    skips of every subscriber (``safety.skip_rows``), ``spans``: :func:`lineages`."""
    from pyspark.sql import functions as F

    got = history["deliveries"].select("kind", "subscriber", "msg_id")
    missing = expected.join(got, ["kind", "subscriber", "msg_id"], "left_anti").alias("m")
    keys = ("kind", "subscriber", "subject")
    same = [missing[k] == spans[k] for k in keys]
    def during(t: Any) -> Any:
        return (spans["l_from"] <= t) & (t < spans["l_to"])

    in_lineage = (
        same[0] & same[1] & same[2] & (spans["l_epoch"] == missing["epoch"])
        & (during(missing["invoke_time"]) | during(missing["time"]))
    )
    owed = missing.join(spans, in_lineage, "left_semi")
    forwarded = missing.join(spans, in_lineage, "left_anti")
    excused = (
        (owed["kind"] == skip["kind"]) & (owed["subscriber"] == skip["subscriber"])
        & (owed["subject"] == skip["subject"])
        & (skip["r_epoch"].isNull() | (skip["r_epoch"] == owed["lo_epoch"]))
        & (owed["seq_lo"] >= skip["r_after"])
        & (skip["r_upto"].isNull() | (owed["seq_hi"] - 1 <= skip["r_upto"]))
        & (skip["r_before"].isNull() | (owed["invoke_time"] <= skip["r_before"]))
    )
    by_position = owed.join(F.broadcast(skip), excused, "left_anti").withColumn(
        "detail", F.lit("not delivered (in its member's lineage at the invoke)"))
    resyncs = history["subscriptions"].where(F.col("event") == "DATA_RESYNC").select(
        *keys, F.col("time").alias("r_time"))
    told = [forwarded[k] == resyncs[k] for k in keys]
    announced = told[0] & told[1] & told[2] & (resyncs["r_time"] > forwarded["invoke_time"])
    silent = forwarded.join(resyncs, announced, "left_anti")
    ended = origins(history, ack).join(endings(history), "origin")
    died = (silent["msg_id"] == ended["msg_id"]) & (ended["ended"] >= silent["invoke_time"])
    by_forward = silent.join(ended, died, "left_anti").withColumn(
        "detail", F.lit("not delivered, no DATA_RESYNC after it (forwarded)"))
    return by_position.unionByName(by_forward)


def duplicates(history: History) -> Any:
    """One msg_id twice for one subscriber within one epoch of a subject."""
    from pyspark.sql import functions as F

    dels = history["deliveries"].where((F.col("type") != "snapshot") & F.col("msg_id").isNotNull())
    return (
        dels.groupBy("kind", "subscriber", "msg_id", "subject", "epoch")
        .agg(F.count("*").alias("n"), F.min("time").alias("time"), F.min("seq").alias("seq"))
        .where(F.col("n") > 1)
    )
