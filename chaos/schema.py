"""The history schema shared by ``chaos/`` (writer) and ``spark_analysis/`` (reader).

A chaos run writes one directory::

    RUN_DIR/
      run.json                # RunInfo: seed, duration, cluster layout, fault switch
      schedule.jsonl          # the nemesis schedule, as generated from the seed
      history/
        publishes.jsonl       # PUBLISH_FIELDS, one line per invoke / ok / fail / info
        deliveries.jsonl      # DELIVERY_FIELDS, one line per message a subscriber received
        subscriptions.jsonl   # SUBSCRIPTION_FIELDS, subscriber lifecycle and notifications
        nemesis.jsonl         # NEMESIS_FIELDS, each fault as it was applied and healed
        cluster.jsonl         # CLUSTER_FIELDS, periodic samples of each member's Raft view
        crashes.jsonl         # CRASH_FIELDS, every member exit the runner did not cause

Every line is a JSON object with exactly the fields listed (``None`` → ``null``).
Times are seconds since the run started (one clock: the runner's
``time.monotonic()``; all processes are on one machine). The Spark jobs build
their ``StructType`` from these tables with :func:`spark_schema`, so the two
sides cannot drift apart.
"""

from __future__ import annotations

from typing import Any

# (name, type) with type one of: "string", "long", "double", "boolean"
Field = tuple[str, str]

PUBLISH_FIELDS: tuple[Field, ...] = (
    ("run", "string"),
    ("publisher", "string"),  # publisher process id, e.g. "p3"
    ("type", "string"),  # invoke | ok | fail | info (info = outcome unknown)
    ("msg_id", "string"),  # unique per publish: "<publisher>-<n>"; also in the content
    ("subject", "string"),
    ("member", "string"),  # member the publish was sent to (migratory-i)
    ("time", "double"),
    ("epoch", "long"),  # ok only
    ("seq", "long"),  # ok only
    ("reason", "string"),  # fail / info only
    ("qos", "string"),  # invoke only: guaranteed | standard (an MQTT subscriber gets
    # standard messages at QoS 0, which MQTT may lose)
)

DELIVERY_FIELDS: tuple[Field, ...] = (
    ("run", "string"),
    ("subscriber", "string"),  # e.g. "s7"
    # sdk (what the SDK hands the app) | raw (protocol-level auditor) | mqtt (a persistent
    # MQTT session: paho-mqtt; epoch and seq null, the checker takes them from the acks) |
    # sse (a GET /events stream, resumed with Last-Event-ID: chaos/sse_workload.py)
    ("kind", "string"),
    ("member", "string"),  # member the subscriber was connected to
    ("subject", "string"),
    ("epoch", "long"),
    ("seq", "long"),
    ("msg_id", "string"),  # parsed from the content; null if the content is not ours
    ("type", "string"),  # snapshot | update | recovered | historical
    ("time", "double"),
    ("connection", "long"),  # mqtt only: the subscriber's connection, 1, 2, ...
)

SUBSCRIPTION_FIELDS: tuple[Field, ...] = (
    ("run", "string"),
    ("subscriber", "string"),
    ("kind", "string"),
    ("subject", "string"),
    # subscribed | unsubscribed | SERVER_UP | SERVER_DOWN | DATA_SYNC | DATA_RESYNC |
    # SUBSCRIBE_ALLOW | SUBSCRIBE_DENY; mqtt: DATA_RESYNC = a retained message after the
    # SUBACK (the cache no longer reached back: the snapshot, or an empty RETAIN when there
    # is none -- then no deliveries row), SESSION_LOST = session present 0 on a resume
    ("event", "string"),
    ("member", "string"),
    ("epoch", "long"),
    ("seq", "long"),
    ("time", "double"),
)

NEMESIS_FIELDS: tuple[Field, ...] = (
    ("run", "string"),
    ("time", "double"),
    # kill | stop (SIGTERM, the member drains) | restart | pause | resume | delay |
    # blackhole | reset | partition | heal | join | leave
    ("fault", "string"),
    ("target", "string"),  # member name, or "a->b" for a link
    ("phase", "string"),  # start | end
    ("detail", "string"),
)

CLUSTER_FIELDS: tuple[Field, ...] = (
    ("run", "string"),
    ("time", "double"),
    ("member", "string"),
    ("up", "boolean"),
    ("role", "string"),  # seed | non-seed
    ("raft_state", "string"),  # leader | follower | candidate | null
    ("raft_leader", "string"),
    ("ready", "boolean"),
    ("applied_clsn", "long"),
)

# A member process that exited without the runner ending it (the runner ends members
# only by SIGKILL, SIGTERM or SIGINT: kill and leave faults, the final stop). A crash
# found when the runner restarts a member is recorded before the restart.
CRASH_FIELDS: tuple[Field, ...] = (
    ("run", "string"),
    ("time", "double"),  # when the runner saw the exit (polled every 0.1 s)
    ("member", "string"),
    ("pid", "long"),
    ("exit_status", "long"),  # the process's exit code; -N = ended by signal N
    ("log_tail", "string"),  # the last lines of the member's log (its stderr)
)

TABLES: dict[str, tuple[Field, ...]] = {
    "publishes": PUBLISH_FIELDS,
    "deliveries": DELIVERY_FIELDS,
    "subscriptions": SUBSCRIPTION_FIELDS,
    "nemesis": NEMESIS_FIELDS,
    "cluster": CLUSTER_FIELDS,
    "crashes": CRASH_FIELDS,
}

# The safety violations the checker reports, by name (the JSON summary's keys): per
# subscriber kind (sdk, raw, sse; mqtt: spark_analysis/mqtt.py for its rules) ...
SUBSCRIBER_VIOLATIONS: tuple[str, ...] = (
    "lost",  # acknowledged, never delivered to a subscriber subscribed throughout
    "unexpected",  # delivered but never published
    "duplicates",  # one subscriber got one msg_id twice (snapshots excepted)
    "reorders",  # one subscriber saw a subject's seq go backwards within an epoch
    "holes",  # seq gap within an epoch not covered by a DATA_RESYNC
    "collisions",  # one (subject, epoch, seq) names two msg_ids
)
# ... and for the member processes (summary kind "members")
MEMBER_VIOLATIONS: tuple[str, ...] = (
    "unexpected_exits",  # a member exited on its own: a row of the crashes table
)
VIOLATIONS: tuple[str, ...] = SUBSCRIBER_VIOLATIONS + MEMBER_VIOLATIONS


def record(table: str, **values: Any) -> dict[str, Any]:
    """A history line with exactly the table's fields; unknown names are an error."""
    fields = TABLES[table]
    names = {name for name, _ in fields}
    unknown = set(values) - names
    if unknown:
        raise KeyError(f"{table}: unknown field(s) {sorted(unknown)}")
    return {name: values.get(name) for name, _ in fields}


def spark_schema(table: str) -> Any:
    """The PySpark ``StructType`` of a table (imports pyspark lazily)."""
    from pyspark.sql import types as T

    kinds = {
        "string": T.StringType(),
        "long": T.LongType(),
        "double": T.DoubleType(),
        "boolean": T.BooleanType(),
    }
    return T.StructType([T.StructField(name, kinds[kind], True) for name, kind in TABLES[table]])
