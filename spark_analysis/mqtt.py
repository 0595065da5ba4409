"""The ``mqtt`` subscriber kind: persistent MQTT sessions (chaos/mqtt_workload.py), and
what our server promises them (docs/mqtt.md), made explicit as the checks' rules.

MQTT carries no position, so an mqtt delivery is recorded with ``epoch`` and ``seq``
null; :func:`with_positions` takes them from the acknowledged publish of its msg_id
before any check runs -- for a message whose publish was never acknowledged (``info``),
from an sdk, raw or sse subscriber that got it (each carries its position); one no such
subscriber got keeps null ones and takes part in ``lost`` and ``unexpected`` only. (Left
null, such a delivery gave a later resync no starting point, so the resync excused
nothing: 14 of seed 1185's "lost" were a session's messages between an ``info`` message
a raw auditor had at seq 9 and the snapshot at seq 41 that its resume sent.) Then, in
``safety.py``:

- **lost**: an acknowledged publish that was sent *guaranteed*, never delivered to a
  persistent session subscribed to its subject throughout, is a violation: the session
  resumes from its saved position on any member (our server's promise for QoS 1; a
  guaranteed message goes out at QoS 1). A *standard* publish goes out at QoS 0, which
  MQTT may lose (a message in flight when the connection drops, its position already
  passed): not counted. Excused as for the other kinds by a resync (below).
- **duplicates**: a msg_id delivered twice *on one connection* is a violation (the
  session records each subject's position, "nothing is delivered twice"). On a later
  connection it is what the server promises: "at least once, not exactly once: messages
  delivered after the last save are delivered again after a resume ... they are not
  marked DUP" (positions are saved about once a second). Snapshots (RETAIN set)
  excepted, as for the other kinds.
- **reorders**: a subject's seq going down from one delivery to the next on one
  connection. The replay at a resume starts again below what the last connection saw,
  so a new connection starts a new comparison.
- **holes**: not checked for mqtt. A seq missing between two deliveries may be a QoS 0
  (standard) message MQTT was allowed to lose, and ``lost`` checks every acknowledged
  guaranteed one; what ``holes`` adds for the other kinds (a gap of never-acknowledged
  seqs) cannot be told apart from a permitted QoS 0 loss here.
- **resync**: MQTT has no DATA_RESYNC. When a resume finds the cache no longer reaching
  back to the saved position (or a member's cache sync moves a live session's subject
  past it), our server sends the subject's snapshot -- or, with none, an empty PUBLISH
  with RETAIN, MQTT's "no retained value" -- (a RETAIN-set PUBLISH after the SUBACK,
  which it sends in no other case to a session without wildcard filters), logs the gap
  and counts it in ``mqtt_resyncs``; the subscriber records it as a ``DATA_RESYNC``
  without a position (the empty one as that row alone: no delivery), which excuses what
  follows the subscriber's last position in that epoch and was invoked before it --
  every message invoked before it when the session had got nothing of the subject yet
  (subscribed before it was numbered, or dropped before its first message came). Only
  on that subscriber's subject: a loss with no such row is lost. (Before the empty
  RETAIN, a subject without a snapshot got nothing and its gap was reported here as
  lost.)
- **collisions** and **unexpected**: as for the other kinds (an mqtt delivery's
  position is the acknowledgement's, so it adds no collision of its own).
- ``SESSION_LOST`` (a resume answered session present 0) is recorded, not itself a
  violation: what the lost session missed is reported as lost.

MQTT *publishers* (chaos/mqtt_publisher.py) get a PUBACK with no position either: their
``ok`` rows are recorded with ``epoch`` and ``seq`` null, and :func:`with_positions` first
gives each one the position its msg_id was delivered at to the subscribers that see
positions (sdk, raw, sse), so that every check holds those publishes to the same rules
as the others. One that no such subscriber received (every one of them resumed past it
with a resync: a small cache) keeps null ones, and gets *bounds* instead: an MQTT
session receives a subject's messages in seq order on one connection, so the message
lies strictly between the nearest deliveries before and after it on that connection
whose positions are known (``seq_lo``, ``seq_hi``, in epoch ``lo_epoch``). When no MQTT
subscriber got it either, the order of events bounds it (:func:`_causal_bounds`): a
message of its subject known to be committed before it was even sent (acknowledged or
delivered before its invoke) lies below it, and one sent after its acknowledgement lies
above it -- one subject's positions in one epoch are given in commit order -- and the
positions between that other messages hold are not its. Both are kept, the tighter
where they agree on the epoch. ``lost`` excuses it for a subscriber
whose resync skips that whole open range; without bounds nothing can excuse it.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from .load import History

KIND = "mqtt"
NOT_CHECKED = ("holes",)  # left out of the mqtt counts (the report shows "-")
MAX_SPAN = 100_000  # positions between an ack's causal bounds looked at one by one, at most


def with_positions(history: History) -> History:
    """``history`` whose acks without a position (MQTT publishers') carry the position
    their msg_id was delivered at, and whose mqtt deliveries carry the epoch and seq of
    their msg_id's ack -- or, with none, the position another kind got it at -- (the other
    rows unchanged); the same object when it has neither."""
    from pyspark.sql import functions as F

    history = acks_with_positions(history)
    if not any(key[0] == KIND for key, _ in history.values.get("deliveries", [])):
        return history
    dels = history["deliveries"]
    ack = (
        history["publishes"]
        .where(F.col("type") == "ok")
        .groupBy("msg_id")
        .agg(F.min("epoch").alias("a_epoch"), F.min("seq").alias("a_seq"))
    )
    seen = (  # where the subscribers that see positions got it (an unacknowledged one)
        dels.where((F.col("kind") != KIND) & F.col("msg_id").isNotNull()
                   & F.col("epoch").isNotNull() & F.col("seq").isNotNull())
        .groupBy("msg_id")
        .agg(F.min(F.struct("epoch", "seq")).alias("d"))
    )
    mq = F.col("kind") == KIND
    acked = F.col("a_epoch").isNotNull() & F.col("a_seq").isNotNull()
    derived = dels.join(ack, "msg_id", "left").join(seen, "msg_id", "left").withColumns({
        "epoch": F.when(mq, F.when(acked, F.col("a_epoch")).otherwise(F.col("d.epoch")))
        .otherwise(F.col("epoch")),
        "seq": F.when(mq, F.when(acked, F.col("a_seq")).otherwise(F.col("d.seq")))
        .otherwise(F.col("seq")),
    }).select(*dels.columns)
    return replace(history, frames={**history.frames, "deliveries": derived.localCheckpoint()})


def acks_with_positions(history: History) -> History:
    """``history`` whose ``ok`` rows without a position take the lowest position their
    msg_id was delivered at to an sdk, raw or sse subscriber (a msg_id has one, or the
    collision and duplicate checks say otherwise); the same object when every ``ok`` row
    has a position."""
    from pyspark.sql import functions as F

    pubs = history["publishes"]
    bare = (F.col("type") == "ok") & (F.col("epoch").isNull() | F.col("seq").isNull())
    if not pubs.where(bare).limit(1).count():
        return history
    seen = (
        history["deliveries"]
        .where((F.col("kind") != KIND) & F.col("msg_id").isNotNull()
               & F.col("epoch").isNotNull() & F.col("seq").isNotNull())
        .groupBy("msg_id")
        .agg(F.min(F.struct("epoch", "seq")).alias("d"))
    )
    filled = pubs.join(seen, "msg_id", "left").withColumns({
        "epoch": F.when(bare, F.col("d.epoch")).otherwise(F.col("epoch")),
        "seq": F.when(bare, F.col("d.seq")).otherwise(F.col("seq")),
    }).select(*pubs.columns)
    stream, causal = _bounds(history, filled), _causal_bounds(history, filled)
    both = F.col("b_epoch").isNotNull() & (F.col("c_epoch") == F.col("b_epoch"))
    use_c = F.col("b_epoch").isNull()  # no MQTT stream bounds it: the order of events
    lo = (F.when(both, F.greatest("b_lo", "c_lo")).when(use_c, F.col("c_lo"))
          .otherwise(F.col("b_lo")))
    hi = (F.when(both, F.least("b_hi", "c_hi")).when(use_c, F.col("c_hi"))
          .otherwise(F.col("b_hi")))
    bounded = filled.join(stream, "msg_id", "left").join(causal, "msg_id", "left").withColumns({
        "seq_lo": F.when(F.col("seq").isNotNull(), F.col("seq") - 1).otherwise(lo),
        "seq_hi": F.when(F.col("seq").isNotNull(), F.col("seq") + 1).otherwise(hi),
        "lo_epoch": F.coalesce(F.col("epoch"), F.col("b_epoch"), F.col("c_epoch")),
    }).select(*pubs.columns, "seq_lo", "seq_hi", "lo_epoch")
    return replace(history, frames={**history.frames, "publishes": bounded.localCheckpoint()})


def _bounds(history: History, pubs: Any) -> Any:
    """Per msg_id acknowledged without a position: ``(b_epoch, b_lo, b_hi)``, the
    positions known just before and just after it on the MQTT connections that got it
    (one subject's messages come in seq order on one connection), the tightest found."""
    from pyspark.sql import Window
    from pyspark.sql import functions as F

    known = (
        pubs.where((F.col("type") == "ok") & F.col("seq").isNotNull())
        .groupBy("msg_id")
        .agg(F.min(F.struct("epoch", "seq")).alias("p"))
    )
    stream = Window.partitionBy("subscriber", "connection", "subject").orderBy("time", "_line")
    before = F.last("p", ignorenulls=True).over(stream.rowsBetween(Window.unboundedPreceding, -1))
    after = F.first("p", ignorenulls=True).over(stream.rowsBetween(1, Window.unboundedFollowing))
    rows = (
        history["deliveries"]
        .where((F.col("kind") == KIND) & (F.col("type") != "snapshot")
               & F.col("msg_id").isNotNull())
        .join(known, "msg_id", "left")
        .select("msg_id", "p", before.alias("before"), after.alias("after"))
        .where(F.col("p").isNull() & F.col("before").isNotNull() & F.col("after").isNotNull()
               & (F.col("before.epoch") == F.col("after.epoch")))
    )
    return rows.groupBy("msg_id").agg(
        F.first("before.epoch").alias("b_epoch"),
        F.max("before.seq").alias("b_lo"),
        F.min("after.seq").alias("b_hi"),
    )


def _causal_bounds(history: History, pubs: Any) -> Any:
    """Per msg_id acknowledged without a position: ``(c_epoch, c_lo, c_hi)`` from the order
    of events on the run's one clock. A message of its subject whose ack or delivery came
    before its invoke was committed before it was sent: its seq is lower (``c_lo``, the
    highest such in the epoch of the last one seen); one invoked after its ack was
    committed after it: higher (``c_hi``, the lowest such in that epoch). Then narrowed to
    the positions between them that no other message is known to hold (an ack's or a
    delivery's): the first free one - 1 and the last free one + 1."""
    from pyspark.sql import functions as F

    invoked = (pubs.where(F.col("type") == "invoke").groupBy("msg_id")
               .agg(F.min("time").alias("t_inv")))
    bare = F.broadcast(
        pubs.where((F.col("type") == "ok") & F.col("seq").isNull())
        .groupBy("msg_id", "subject").agg(F.min("time").alias("t_ack"))
        .join(invoked, "msg_id")
    )
    cols = ["msg_id", "subject", "epoch", "seq", "time"]
    known = (
        pubs.where((F.col("type") == "ok") & F.col("seq").isNotNull()).select(*cols)
        .unionByName(history["deliveries"].where(
            (F.col("kind") != KIND) & F.col("msg_id").isNotNull() & F.col("epoch").isNotNull()
            & F.col("seq").isNotNull()).select(*cols))
        .groupBy("msg_id", "subject", "epoch", "seq").agg(F.min("time").alias("seen"))
        .join(invoked, "msg_id", "left")
        .select(F.col("msg_id").alias("k_id"), F.col("subject").alias("k_subject"),
                F.col("epoch").alias("k_epoch"), F.col("seq").alias("k_seq"), "seen",
                F.col("t_inv").alias("k_inv"))
    )
    same = F.col("subject") == F.col("k_subject")
    lower = (
        bare.join(known, same & (F.col("seen") < F.col("t_inv")))
        .groupBy("msg_id", "k_epoch").agg(F.max("seen").alias("last"), F.max("k_seq").alias("lo"))
        .groupBy("msg_id").agg(F.max(F.struct("last", "k_epoch", "lo")).alias("l"))
        .select("msg_id", F.col("l.k_epoch").alias("c_epoch"), F.col("l.lo").alias("c_lo"))
    )
    upper = (
        bare.join(known, same & (F.col("k_inv") > F.col("t_ack")))
        .groupBy("msg_id", "k_epoch").agg(F.min("k_seq").alias("c_hi"))
    )
    bounds = lower.join(upper, (lower["msg_id"] == upper["msg_id"])
                        & (F.col("c_epoch") == F.col("k_epoch"))).select(
        lower["msg_id"], "c_epoch", "c_lo", "c_hi")
    # narrowed to the free positions: those between that no other message holds
    free = (
        bounds.where(F.col("c_hi") - F.col("c_lo") <= MAX_SPAN)
        .join(bare.select("msg_id", "subject"), "msg_id")
        .withColumn("p", F.explode(F.sequence(F.col("c_lo") + 1, F.col("c_hi") - 1)))
        .join(known.select("k_subject", "k_epoch", "k_seq").distinct(),
              (F.col("subject") == F.col("k_subject")) & (F.col("c_epoch") == F.col("k_epoch"))
              & (F.col("p") == F.col("k_seq")), "left_anti")
        .groupBy("msg_id").agg((F.min("p") - 1).alias("f_lo"), (F.max("p") + 1).alias("f_hi"))
    )
    return bounds.join(free, "msg_id", "left").select(
        "msg_id", "c_epoch", F.coalesce("f_lo", "c_lo").alias("c_lo"),
        F.coalesce("f_hi", "c_hi").alias("c_hi"))
