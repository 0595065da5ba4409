"""The one local SparkSession the analysis runs on: ``local[2]``, quiet logs, small shuffles."""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Any

CONF_DIR = Path(__file__).with_name("conf")  # log4j2.properties: errors only


def spark_session(app: str = "migratory-chaos-analysis") -> Any:
    """Start (or reuse) the session. Start-up takes 9-14 s on the reference machine."""
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("SPARK_CONF_DIR", str(CONF_DIR))
    from pyspark.sql import SparkSession

    builder = SparkSession.builder
    for kv in os.environ.get("SA_CONF", "").split(";"):
        if kv:
            k, v = kv.split("=", 1)
            builder = builder.config(k, v)
    spark = (
        builder.master("local[2]")
        .appName(app)
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.sql.shuffle.partitions", "4")
        .config("spark.default.parallelism", "2")
        .config("spark.sql.adaptive.enabled", "true")
        .config("spark.driver.memory", "2g")
        .config("spark.sql.session.timeZone", "UTC")
        .getOrCreate()
    )
    spark.sparkContext.setLogLevel("ERROR")
    return spark
