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
  - *owed by forwarding*: S followed another lineage then. A member forwards in the
    order it numbers, and the member that takes a forward after a gap resyncs the subject
    before it: so the loss is announced by a ``DATA_RESYNC`` of the subject to S (or a
    fresh ``SUBSCRIBE_ALLOW`` with a position: S starting anew) after the invoke, no
    earlier than the last message of its sender S got before it and no later than the
    first S got after it (:func:`heard`: a sender's message is after it when it is later
    in the ack's epoch, or numbered by the same member and invoked after the ack -- in
    its next epoch of the subject or its next life). A resync outside that window is of
    another gap. Not owed when the sender (the member that numbered it:
    :func:`owners`) was ended after the invoke -- killed, stopped, left, crashed: a
    forward dies with its sender's queue -- and S never got anything the sender
    numbered after it: its next forward of the subject, in its next life too, shows the
    loss to the member that takes it, which resyncs then.

h103's first rules (2026-11-28) took any later ``DATA_RESYNC`` of the subject for the
announcement and the sender's end, whenever it came, for an excuse:
``tests/spark/test_spark_standard.py`` plants a history each lets pass.
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


def owners(history: History, ack: Any) -> Any:
    """``(msg_id, origin)``: the member that numbered each acknowledged message -- the
    member whose deliveries carry its epoch most often (an epoch is one member's, and a
    raw auditor records the member it is connected to), else the member the ack names
    (an SDK publisher names the member it was on at the invoke: its publish may go out
    on its next session, to another member)."""
    from pyspark.sql import Window
    from pyspark.sql import functions as F

    counts = (
        history["deliveries"].where(F.col("member").isNotNull() & F.col("epoch").isNotNull())
        .groupBy("epoch", "member").count()
    )
    most = Window.partitionBy("epoch").orderBy(F.desc("count"), "member")
    by_epoch = counts.withColumn("_n", F.row_number().over(most)).where(F.col("_n") == 1)
    return ack.join(by_epoch.select("epoch", F.col("member").alias("_owner")), "epoch", "left") \
        .select("msg_id", F.coalesce("_owner", "member").alias("origin"))


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


def heard(history: History, inv: Any, ack: Any, origin: Any, forwarded: Any) -> Any:
    """``forwarded`` (with its ``origin``) with ``heard_before`` and ``heard_after``: the
    last time its subscriber got (live: an update or a recovered message) a message its
    sender numbered before it, before the first time it got one numbered after it (null:
    never). A later one is numbered after it in the same epoch, or by the same member
    invoked after its ack (in that member's next lineage or life); an earlier one before
    it in the epoch, or by the same member acknowledged before its invoke. A member
    forwards in the order it numbers, so the subscriber's member, which took the later
    one, saw the gap then."""
    from pyspark.sql import functions as F

    keys = ("kind", "subscriber", "subject")
    numbered = (
        ack.join(inv, "msg_id", "left").join(origin, "msg_id", "left")
        .select("msg_id", F.col("epoch").alias("b_epoch"), F.col("seq").alias("b_seq"),
                F.col("origin").alias("b_origin"), F.col("time").alias("b_ack"),
                F.coalesce("invoke_time", "time").alias("b_invoke"))
    )
    live = (
        history["deliveries"].where(F.col("type").isin("update", "recovered"))
        .select(*keys, "msg_id", F.col("time").alias("d_time"))
        .join(numbered, "msg_id")
        .drop("msg_id")
    )
    row = ["kind", "subscriber", "msg_id"]
    f, d = F.col, F.col  # (columns of the missing message "f", of the live delivery "l")
    same = (f("f.kind") == d("l.kind")) & (f("f.subscriber") == d("l.subscriber")) & (
        f("f.subject") == d("l.subject"))
    by_member = f("f.origin").isNotNull() & (d("l.b_origin") == f("f.origin"))
    later = ((d("l.b_epoch") == f("f.epoch")) & (d("l.b_seq") > f("f.seq"))) | (
        by_member & (d("l.b_invoke") > f("f.time")))
    earlier = (((d("l.b_epoch") == f("f.epoch")) & (d("l.b_seq") < f("f.seq"))) | (
        by_member & (d("l.b_ack") < f("f.invoke_time")))) & (
        f("f.heard_after").isNull() | (d("l.d_time") <= f("f.heard_after")))

    def first(rows: Any, agg: Any, name: str, order: Any) -> Any:
        found = F.broadcast(rows.alias("f")).join(live.alias("l"), same & order).groupBy(
            *[f(f"f.{k}").alias(k) for k in row]).agg(agg("l.d_time").alias(name))
        return rows.join(found, row, "left")

    with_after = first(forwarded, F.min, "heard_after", later)
    return first(with_after, F.max, "heard_before", earlier)


def lost(history: History, inv: Any, ack: Any, skip: Any, expected: Any,
         spans: Any) -> Any:
    """The acknowledged messages a subscriber was owed and never got nor was told of
    (module docstring). ``expected``: acks joined with the subscribers subscribed
    throughout to their subject before their invoke (``safety.lost``'s), ``skip``: the
    skips of every subscriber (``safety.skip_rows``), ``spans``: :func:`lineages`."""
    from pyspark.sql import functions as F

    got = history["deliveries"].select("kind", "subscriber", "msg_id")
    # (few rows, each read several times below: computed once)
    missing = expected.join(got, ["kind", "subscriber", "msg_id"], "left_anti") \
        .localCheckpoint().alias("m")
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
    return by_position.unionByName(forward_lost(history, inv, ack, forwarded))


def forward_lost(history: History, inv: Any, ack: Any, forwarded: Any) -> Any:
    """Of ``forwarded`` (missing, the subscriber on another member's lineage), those
    neither announced in time nor lost with their sender (module docstring)."""
    from pyspark.sql import functions as F

    keys = ("kind", "subscriber", "subject")
    origin = owners(history, ack)
    f = forwarded.join(F.broadcast(origin), "msg_id", "left").localCheckpoint()
    window = heard(history, inv, ack, origin, f).localCheckpoint()
    subs = history["subscriptions"]
    starts = subs.where(
        (F.col("event") == "DATA_RESYNC")
        | ((F.col("event") == "SUBSCRIBE_ALLOW") & F.col("epoch").isNotNull())
    ).select(*keys, F.col("time").alias("r_time"))
    w, r = F.col, F.col  # (columns of the window "w", of a resync "r" or an ending "e")
    in_time = (
        (w("w.kind") == r("r.kind")) & (w("w.subscriber") == r("r.subscriber"))
        & (w("w.subject") == r("r.subject")) & (r("r.r_time") > w("w.invoke_time"))
        & (w("w.heard_before").isNull() | (r("r.r_time") >= w("w.heard_before")))
        & (w("w.heard_after").isNull() | (r("r.r_time") <= w("w.heard_after")))
    )
    silent = window.alias("w").join(starts.alias("r"), in_time, "left_anti")
    died = (
        w("w.heard_after").isNull() & w("w.origin").isNotNull()
        & (w("w.origin") == r("e.origin")) & (r("e.ended") >= w("w.invoke_time"))
    )
    detail = F.when(
        F.col("heard_after").isNull(),
        F.lit("not delivered, no DATA_RESYNC after it (forwarded)"),
    ).otherwise(F.concat(
        F.lit("not delivered, no DATA_RESYNC between "),
        F.format_number(F.coalesce("heard_before", "invoke_time"), 3), F.lit(" and "),
        F.format_number("heard_after", 3),
        F.lit(" s (its sender's earlier and later messages to it; forwarded)")))
    ended = endings(history).alias("e")
    return silent.alias("w").join(ended, died, "left_anti").withColumn("detail", detail) \
        .drop("origin", "heard_before", "heard_after")


def duplicates(history: History) -> Any:
    """One msg_id twice for one subscriber within one epoch of a subject."""
    from pyspark.sql import functions as F

    dels = history["deliveries"].where((F.col("type") != "snapshot") & F.col("msg_id").isNotNull())
    return (
        dels.groupBy("kind", "subscriber", "msg_id", "subject", "epoch")
        .agg(F.count("*").alias("n"), F.min("time").alias("time"), F.min("seq").alias("seq"))
        .where(F.col("n") > 1)
    )
