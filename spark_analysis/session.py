"""The SparkSession the analysis runs on: ``local[2]`` by default, any master on request.

- ``python -m spark_analysis RUN_DIR`` starts its own session: ``local[2]``, or the
  ``--master`` given (``local[4]``, ``spark://host:7077``, ``yarn``, ``k8s://…``).
- Under ``spark-submit`` the session is the one spark-submit set up (its ``--master``,
  ``--conf``, ``--packages``); ``--master`` of this program, when given, wins.

Local masters get the small-machine settings (quiet logs, 4 shuffle partitions, 2 GB
driver, no adaptive query execution); other masters keep the cluster's own defaults.

Adaptive query execution (AQE) is off on a local master: it runs every shuffle stage of a
query as a job of its own and, after each, optimises, plans and describes the whole rest of
the query again (the plan's description for the SQL listeners, cached tables' plans
included). The safety check is one query of a few dozen stages over cached tables: with
AQE, most of its time went there -- the tests' merged planted history: 84 s of safety
check, 51 s of JVM CPU for the whole analysis; without, 50 s and 31 s; a 30,000-publish
history 34 s -> 23 s of JVM CPU (2 cores, a loaded box). What AQE would bring (fewer
shuffle partitions, broadcast joins chosen at run time) the checker sets itself: 4
partitions, broadcast hints on the small sides.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Any

CONF_DIR = Path(__file__).with_name("conf")  # log4j2.properties: errors only
DEFAULT_MASTER = "local[2]"
# pyspark's own sign that spark-submit started the JVM and handed this driver its gateway
SUBMIT_GATEWAY = "PYSPARK_GATEWAY_PORT"


def under_spark_submit() -> bool:
    return SUBMIT_GATEWAY in os.environ


def spark_session(app: str = "migratory-chaos-analysis", master: str | None = None) -> Any:
    """Start (or reuse) the session. ``master`` None: spark-submit's master when this runs
    under spark-submit, else :data:`DEFAULT_MASTER`. Start-up takes 9-14 s locally."""
    submitted = under_spark_submit()
    if master is None and not submitted:
        master = DEFAULT_MASTER
    local = master is not None and master.startswith("local")
    if not submitted:  # pyspark launches the JVM: it reads these
        os.environ.setdefault("SPARK_CONF_DIR", str(CONF_DIR))
    if local:  # Python workers, if any, run next to this driver
        os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    from pyspark.sql import SparkSession

    builder = SparkSession.builder.appName(app)
    if master is not None:
        builder = builder.master(master)
    builder = builder.config("spark.sql.session.timeZone", "UTC")
    if local:
        builder = (
            builder.config("spark.ui.enabled", "false")
            .config("spark.ui.showConsoleProgress", "false")
            .config("spark.sql.shuffle.partitions", "4")
            .config("spark.default.parallelism", "2")
            .config("spark.sql.adaptive.enabled", "false")
            .config("spark.driver.memory", "2g")
        )
    for kv in os.environ.get("SA_CONF", "").split(";"):
        if kv:
            k, v = kv.split("=", 1)
            builder = builder.config(k, v)
    spark = builder.getOrCreate()
    if master is None and str(spark.sparkContext.master).startswith("local"):
        # a local master chosen by spark-submit: small shuffles and no AQE too (runtime
        # settings)
        spark.conf.set("spark.sql.shuffle.partitions", "4")
        spark.conf.set("spark.sql.adaptive.enabled", "false")
    spark.sparkContext.setLogLevel("ERROR")
    return spark


def describe(spark: Any) -> dict[str, str]:
    """Where and how the analysis ran (for the summary): master, version, and whether
    adaptive query execution was on (``"false"`` on a local master)."""
    return {"master": str(spark.sparkContext.master), "version": str(spark.version),
            "adaptive": str(spark.conf.get("spark.sql.adaptive.enabled"))}
