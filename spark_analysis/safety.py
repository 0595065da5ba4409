"""The safety checks: every name of ``chaos.schema.SUBSCRIBER_VIOLATIONS``, per subscriber
kind (member exits: ``exits.py``).

Each check is a small query producing rows of one common shape (:data:`COLUMNS`); the
six are unioned, computed once into a local checkpoint, then counted and sampled.

A frame that later queries build on is a local checkpoint (``localCheckpoint``), not a
cache: a cached frame keeps its whole logical plan, and Spark's driver analyses that plan
again (relations deduplicated, every node checked, cached plans looked up) for each
DataFrame operation and action on top of it, which was much of the JVM's CPU in a check
of a few thousand rows; a checkpoint is a leaf. (Nothing unpersists one: its blocks go
when the JVM collects the frame.)

A subscriber's *position* for a subject moves with every update / recovered delivery and
every status that carries one (``SUBSCRIBE_ALLOW``, ``DATA_SYNC``, ``DATA_RESYNC``). A
*skip* is a range of positions the subscriber was told it will not get (pure function
:func:`skips`): a ``DATA_RESYNC`` (or a fresh subscribe's ``SUBSCRIBE_ALLOW``) at
``(e, s)`` after position ``(e, p)`` skips seqs ``p+1 .. s`` of epoch ``e`` (``1 .. s``
when the previous position was in another epoch or there was none); a ``DATA_RESYNC``
to another epoch, or without a position, also skips the rest of the old epoch after
``p`` -- for messages invoked before it; one without a position after ``(e, 0)`` (the
position of a subject not numbered yet where the subscriber subscribed: it has seen
nothing of its lineage) skips every epoch's messages invoked before it, for ``lost``
(a hole lies between two deliveries of one epoch: the skips of that epoch cover it).
``DATA_SYNC`` skips nothing.

- lost: a publish acknowledged ok, not delivered (any type) to a subscriber subscribed
  to its subject throughout (``subscribed`` before the invoke; no ``unsubscribed`` /
  ``SUBSCRIBE_DENY`` before the last publish ok: a teardown after publishing stopped
  does not count), and not in one of that subscriber's skips for that subject.
- unexpected: a delivery whose msg_id was never invoked (or is not ours: null).
- duplicates: one subscriber got one msg_id more than once (snapshots excepted).
- reorders: a subscriber's seq of a subject went down from one delivery to the next
  within an epoch (deliveries in time order, file order on ties; snapshots excepted).
- holes: seqs missing between two delivered seqs of one epoch (snapshots excepted),
  unless that subscriber's skips of that subject cover them all (one skip, or several
  that meet: :func:`joined`), or it unsubscribed between the two deliveries.
- collisions: one (subject, epoch, seq) names two msg_ids across publish acks and that
  kind's deliveries (acks count for every kind).

A Standard run (``run.json`` mode) holds lost and duplicates to Standard's rules:
``standard.py``.

The ``sse`` kind (``GET /events`` streams, chaos/sse_workload.py) is held to exactly these
rules: its events carry each message's position and the ``sync`` / ``resync`` statuses
with theirs, and a stream resumed from its ``Last-Event-ID`` promises what a native
resume does.

The ``mqtt`` kind (persistent MQTT sessions) takes its positions from the acks and has
MQTT's rules -- lost only for guaranteed (QoS 1) publishes, duplicates and reorders per
connection, no holes: ``mqtt.py`` says why.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from chaos.schema import SUBSCRIBER_VIOLATIONS as VIOLATIONS

from . import mqtt, standard
from .load import History

Examples = dict[str, dict[str, list[dict[str, Any]]]]

KINDS = ("sdk", "raw")
MAX_EXAMPLES = 20
COLUMNS = ("kind", "violation", "subscriber", "subject", "epoch", "seq", "msg_id", "time", "detail")
POSITION_STATUSES = ("SUBSCRIBE_ALLOW", "DATA_SYNC", "DATA_RESYNC")
POSITION_DELIVERIES = ("update", "recovered")
SKIP_SCHEMA = (
    "kind string, subscriber string, subject string, "
    "r_epoch long, r_after long, r_upto long, r_before double"
)


@dataclass(frozen=True)
class Jump:
    """A status that may move a subscriber's position, with the position before it."""

    kind: str
    subscriber: str
    subject: str
    event: str  # DATA_RESYNC | SUBSCRIBE_ALLOW
    time: float
    epoch: int | None
    seq: int | None
    prev_epoch: int | None
    prev_seq: int | None
    seen: bool = True  # a delivery (a snapshot's aside) of the subject came before it


# (epoch (None = every epoch), after (exclusive), upto (inclusive; None = open),
#  before (invoked before; None))
Skip = tuple[int | None, int, int | None, float | None]


def skips(jump: Jump) -> list[Skip]:
    """The position ranges ``jump`` told its subscriber it will not get."""
    out: list[Skip] = []
    if jump.epoch is not None and jump.seq is not None:
        same = jump.prev_epoch == jump.epoch and jump.prev_seq is not None
        after = jump.prev_seq if same and jump.prev_seq is not None else 0
        if jump.seq > after:
            out.append((jump.epoch, after, jump.seq, None))
    if (jump.event == "DATA_RESYNC" and jump.kind == mqtt.KIND and jump.prev_epoch is None
            and not jump.seen):
        # an MQTT session that had got nothing of the subject (subscribed before it was
        # numbered, or dropped before its first message came) resumed off the cache: the
        # snapshot it got, its only sign (mqtt.py), announces every message invoked before
        out.append((None, 0, None, jump.time))
    if jump.event != "DATA_RESYNC" or jump.prev_epoch is None or jump.prev_seq is None:
        return out
    if jump.epoch is None or jump.epoch != jump.prev_epoch:
        out.append((jump.prev_epoch, jump.prev_seq, None, jump.time))
    if jump.epoch is None and jump.prev_seq == 0:
        # it had seen nothing numbered: whatever the subject's lineage turned out to be
        # (its first messages expired and the subject forgotten before the resume), the
        # resync announces every message invoked before it
        out.append((None, 0, None, jump.time))
    return out


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
    """msg_id -> first invoke time and qos (cached: lost, unexpected and latency read it)."""
    from pyspark.sql import functions as F

    pubs = history["publishes"]
    return (
        pubs.where(F.col("type") == "invoke")
        .groupBy("msg_id")
        .agg(F.min("time").alias("invoke_time"), F.first("qos", ignorenulls=True).alias("qos"))
        .cache()
    )


def acks(history: History) -> Any:
    from pyspark.sql import functions as F

    pubs = history["publishes"]
    ok = pubs.where(F.col("type") == "ok")
    if "seq_lo" not in pubs.columns:  # every ack carries its position (mqtt.py)
        ok = ok.withColumns({"seq_lo": F.col("seq") - 1, "seq_hi": F.col("seq") + 1,
                             "lo_epoch": F.col("epoch")})
    return ok.select("msg_id", "subject", "epoch", "seq", "time", "seq_lo", "seq_hi", "lo_epoch",
                     "member")


def positions(history: History) -> tuple[Any, list[Jump]]:
    """One time-ordered pass over each subscriber's subject: ``(reorders, jumps)``.

    Deliveries (snapshots excepted) and position statuses, ordered by time, deliveries
    first on ties; the previous delivery gives reorders, the previous position gives
    each jump's starting point.
    """
    from pyspark.sql import Window
    from pyspark.sql import functions as F

    keys = ["kind", "subscriber", "subject"]
    dels = (
        history["deliveries"]
        .where(F.col("type") != "snapshot")
        .select(*keys, "time", "_line", F.lit(0).alias("ord"), F.col("type").alias("event"),
                "epoch", "seq", "msg_id", "connection")
    )
    subs = (
        history["subscriptions"]
        .where(F.col("event").isin(*POSITION_STATUSES) & F.col("subject").isNotNull())
        .select(*keys, "time", "_line", F.lit(1).alias("ord"), "event", "epoch", "seq")
        .withColumns({"msg_id": F.lit(None).cast("string"),
                      "connection": F.lit(None).cast("long")})
    )
    w = (
        Window.partitionBy(*keys)
        .orderBy("time", "ord", "_line")
        .rowsBetween(Window.unboundedPreceding, -1)
    )
    is_delivery = F.col("ord") == 0
    moves = F.col("epoch").isNotNull() & (
        (F.col("ord") == 1) | F.col("event").isin(*POSITION_DELIVERIES)
    )
    prev_d = F.last(
        F.when(is_delivery, F.struct("epoch", "seq", "msg_id", "connection")), ignorenulls=True
    )
    prev_p = F.last(F.when(moves, F.struct("epoch", "seq")), ignorenulls=True)
    stream = dels.unionByName(subs).withColumns({"pd": prev_d.over(w), "pp": prev_p.over(w)})
    reorder = (
        is_delivery
        & (F.col("pd.epoch") == F.col("epoch"))
        & (F.col("seq") < F.col("pd.seq"))
        & F.col("pd.connection").eqNullSafe(F.col("connection"))  # mqtt: per connection
    )
    jump = F.col("event").isin("DATA_RESYNC", "SUBSCRIBE_ALLOW")
    found = stream.where(reorder | jump).localCheckpoint()
    jumps = [
        Jump(
            kind=r["kind"],
            subscriber=r["subscriber"],
            subject=r["subject"],
            event=r["event"],
            time=r["time"],
            epoch=r["epoch"],
            seq=r["seq"],
            prev_epoch=r["pp"]["epoch"] if r["pp"] else None,
            prev_seq=r["pp"]["seq"] if r["pp"] else None,
            seen=r["pd"] is not None,
        )
        for r in found.where(jump).collect()
    ]
    detail = F.concat(
        F.lit("after seq "), F.col("pd.seq"), F.lit(" ("), F.col("pd.msg_id"), F.lit(")")
    )
    return _shape(found.where(reorder), "reorders", detail=detail), jumps


SkipRow = tuple[str, str, str, int | None, int, int | None, float | None]


def skip_rows(jumps: list[Jump]) -> list[SkipRow]:
    return [(j.kind, j.subscriber, j.subject, *s) for j in jumps for s in skips(j)]


def joined(rows: list[SkipRow]) -> list[SkipRow]:
    """The skips of each subscriber's subject and epoch joined where they meet or
    overlap, whatever their ``before``: what a hole between two deliveries may be
    covered by. Two resyncs in a row with no delivery between them (a subscriber that
    fails over twice off the cache) skip ``p+1 .. s1`` and ``s1+1 .. s2``: together
    they announce the whole hole ``p+1 .. s2``, neither alone does."""
    out: list[SkipRow] = []
    rows = [r for r in rows if r[3] is not None]  # every-epoch skips are for lost only
    for row in sorted(rows, key=lambda r: (r[:4], r[4])):
        last = out[-1] if out else None
        if last is not None and last[:4] == row[:4] and (last[5] is None or row[4] <= last[5]):
            upto = None if last[5] is None or row[5] is None else max(last[5], row[5])
            out[-1] = (*last[:5], upto, None)
        else:
            out.append((*row[:6], None))
    return out


def skip_frame(spark: Any, rows: list[SkipRow]) -> Any:
    return spark.createDataFrame(rows, SKIP_SCHEMA)


def unexpected(history: History, inv: Any) -> Any:
    from pyspark.sql import functions as F

    dels = history["deliveries"]
    found = dels.join(F.broadcast(inv.select("msg_id")), "msg_id", "left_anti")
    return _shape(found, "unexpected", detail=F.concat(F.lit("type "), found["type"]))


def duplicates(history: History) -> Any:
    from pyspark.sql import functions as F

    dels = history["deliveries"].where((F.col("type") != "snapshot") & F.col("msg_id").isNotNull())
    found = (
        dels.groupBy("kind", "subscriber", "msg_id", "connection")  # mqtt: per connection
        .agg(
            F.count("*").alias("n"),
            F.min("time").alias("time"),
            F.first("subject").alias("subject"),
            F.min("epoch").alias("epoch"),
            F.min("seq").alias("seq"),
        )
        .where(F.col("n") > 1)
    )
    return _shape(found, "duplicates", detail=F.concat(F.lit("copies="), F.col("n")))


def _same_stream(left: Any, right: Any) -> Any:
    return (
        (left["kind"] == right["kind"])
        & (left["subscriber"] == right["subscriber"])
        & (left["subject"] == right["subject"])
    )


def holes(history: History, skip: Any) -> Any:
    from pyspark.sql import Window
    from pyspark.sql import functions as F

    keys = ["kind", "subscriber", "subject", "epoch"]
    dels = history["deliveries"].where(
        (F.col("type") != "snapshot") & F.col("seq").isNotNull() & F.col("epoch").isNotNull()
        & (F.col("kind") != mqtt.KIND)
    )
    w = Window.partitionBy(*keys).orderBy("seq", "time")
    gaps = (
        dels.select(
            *keys,
            "seq",
            "time",
            F.lead("seq").over(w).alias("next_seq"),
            F.lead("time").over(w).alias("next_time"),
        )
        .where(F.col("next_seq") > F.col("seq") + 1)
        .alias("g")
    )
    covered = (
        _same_stream(gaps, skip)
        & (skip["r_epoch"] == gaps["epoch"])
        & (skip["r_after"] <= gaps["seq"])
        & (skip["r_upto"].isNull() | (skip["r_upto"] >= gaps["next_seq"] - 1))
    )
    gaps = gaps.join(F.broadcast(skip), covered, "left_anti")
    subs = history["subscriptions"]
    unsub = subs.where(F.col("event") == "unsubscribed").select(
        "kind", "subscriber", "subject", F.col("time").alias("u_time")
    )
    lo = F.least(gaps["time"], gaps["next_time"])
    hi = F.greatest(gaps["time"], gaps["next_time"])
    between = _same_stream(gaps, unsub) & (unsub["u_time"] >= lo) & (unsub["u_time"] <= hi)
    found = gaps.join(F.broadcast(unsub), between, "left_anti")
    detail = F.concat(F.lit("missing seq "), F.col("seq") + 1, F.lit(".."), F.col("next_seq") - 1)
    return _shape(found, "holes", seq=F.col("seq") + 1, detail=detail)


def eligible(history: History, last_ok: float) -> Any:
    """(kind, subscriber, subject, first_sub) of the subscriptions held throughout."""
    from pyspark.sql import functions as F

    subs = history["subscriptions"].where(F.col("subject").isNotNull())
    gone = F.col("event").isin("unsubscribed", "SUBSCRIBE_DENY")
    return (
        subs.groupBy("kind", "subscriber", "subject")
        .agg(
            F.min(F.when(F.col("event") == "subscribed", F.col("time"))).alias("first_sub"),
            F.min(F.when(gone, F.col("time"))).alias("gone"),
        )
        .where(
            F.col("first_sub").isNotNull()
            & (F.col("gone").isNull() | (F.col("gone") > last_ok))
        )
        .select("kind", "subscriber", "subject", "first_sub")
    )


def owed(history: History, inv: Any, ack: Any, last_ok: float) -> Any:
    """Each ack with the subscribers held to it: subscribed to its subject throughout,
    since before its invoke (an MQTT one: guaranteed publishes only)."""
    from pyspark.sql import functions as F

    published = ack.join(inv, "msg_id", "left").withColumn(
        "invoke_time", F.coalesce("invoke_time", "time")
    )
    return published.join(F.broadcast(eligible(history, last_ok)), "subject").where(
        (F.col("first_sub") < F.col("invoke_time"))
        & ((F.col("kind") != mqtt.KIND) | F.col("qos").isNull() | (F.col("qos") != "standard"))
    )


def lost(history: History, inv: Any, ack: Any, skip: Any, last_ok: float) -> Any:
    from pyspark.sql import functions as F

    expected = owed(history, inv, ack, last_ok)
    got = history["deliveries"].select("kind", "subscriber", "msg_id")
    missing = expected.join(got, ["kind", "subscriber", "msg_id"], "left_anti")
    excused = (
        _same_stream(missing, skip)
        # (a position known, seq_lo = seq - 1 and seq_hi = seq + 1; an MQTT publisher's
        # ack nobody with positions got: the open range it lies in, mqtt.py)
        & (skip["r_epoch"].isNull() | (skip["r_epoch"] == missing["lo_epoch"]))
        & (missing["seq_lo"] >= skip["r_after"])
        & (skip["r_upto"].isNull() | (missing["seq_hi"] - 1 <= skip["r_upto"]))
        & (skip["r_before"].isNull() | (missing["invoke_time"] <= skip["r_before"]))
    )
    found = missing.join(F.broadcast(skip), excused, "left_anti")
    return _shape(found, "lost", time=F.col("invoke_time"), detail=F.lit("not delivered"))


def collisions(history: History, ack: Any, kinds: list[str]) -> Any:
    from pyspark.sql import functions as F

    spark = history["publishes"].sparkSession
    kinds_df = spark.createDataFrame([(k,) for k in kinds], "kind string")
    cols = ["kind", "subject", "epoch", "seq", "msg_id", "time"]
    acked = ack.crossJoin(F.broadcast(kinds_df)).select(*cols)
    known = F.col("msg_id").isNotNull() & F.col("epoch").isNotNull() & F.col("seq").isNotNull()
    ids = (
        history["deliveries"]
        .select(*cols)
        .unionByName(acked)
        .where(known)
        .groupBy("kind", "subject", "epoch", "seq", "msg_id")
        .agg(F.min("time").alias("time"))
    )
    found = (
        ids.groupBy("kind", "subject", "epoch", "seq")
        .agg(
            F.count("*").alias("n"),
            F.min("time").alias("time"),
            F.sort_array(F.collect_list("msg_id")).alias("ids"),
        )
        .where(F.col("n") > 1)
    )
    return _shape(found, "collisions", detail=F.concat_ws(" vs ", F.col("ids")))


def check(
    history: History, inv: Any | None = None
) -> tuple[dict[str, dict[str, int]], Examples]:
    """``(violations, examples)``: counts and up to 20 examples per kind and name."""
    from pyspark.sql import Window
    from pyspark.sql import functions as F

    own_inv = inv is None
    inv = invokes(history) if inv is None else inv
    history = mqtt.with_positions(history)
    ack = acks(history)
    last_ok = ack.agg(F.max("time")).collect()[0][0]
    kinds = sorted({*KINDS, *(str(k[0]) for k, _ in history.values.get("deliveries", []))})
    reorders, jumps = positions(history)
    spark = history["publishes"].sparkSession
    skip = skip_frame(spark, skip_rows(jumps))
    last_ok = last_ok if last_ok is not None else float("inf")
    if standard.is_standard(history):  # (the rules that differ: spark_analysis/standard.py)
        spans = standard.lineages(history, POSITION_STATUSES, POSITION_DELIVERIES)
        found_lost = standard.lost(history, inv, ack, skip, owed(history, inv, ack, last_ok),
                                   spans)
        lost_part = _shape(found_lost, "lost", time=F.col("invoke_time"))
        dups = standard.duplicates(history)
        dup_part = _shape(dups, "duplicates", detail=F.concat(F.lit("copies="), F.col("n")))
    else:
        lost_part, dup_part = lost(history, inv, ack, skip, last_ok), duplicates(history)
    parts = [
        lost_part,
        unexpected(history, inv),
        dup_part,
        reorders,
        holes(history, skip_frame(spark, joined(skip_rows(jumps)))),
        collisions(history, ack, kinds),
    ]
    found = parts[0]
    for part in parts[1:]:
        found = found.unionByName(part)
    found = found.localCheckpoint()
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
    for name in mqtt.NOT_CHECKED:
        violations.get(mqtt.KIND, {}).pop(name, None)
        examples.get(mqtt.KIND, {}).pop(name, None)
    if own_inv:
        inv.unpersist()
    return violations, examples
