"""spark_analysis/session.py without a JVM: which master the session is asked for, and
which settings, with and without spark-submit (``pyspark.sql.SparkSession`` replaced by
a builder that notes what it is told). test_spark_submit.py runs the real spark-submit
once, on its own master."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import pytest

pytest.importorskip("pyspark")

from spark_analysis import session


@dataclass
class Built:
    """What the builder was told, and the session it hands back."""

    started_master: str  # the master the JVM has (spark-submit's, or the builder's)
    masters: list[str] = field(default_factory=list)
    settings: dict[str, str] = field(default_factory=dict)
    runtime: dict[str, str] = field(default_factory=dict)

    # the builder
    def appName(self, name: str) -> Built:
        return self

    def master(self, master: str) -> Built:
        self.masters.append(master)
        return self

    def config(self, key: str, value: str) -> Built:
        self.settings[key] = value
        return self

    def getOrCreate(self) -> Any:
        built = self

        class Conf:
            def set(self, key: str, value: str) -> None:
                built.runtime[key] = value

        class Context:
            master = self.masters[-1] if self.masters else self.started_master

            def setLogLevel(self, level: str) -> None:
                pass

        class Spark:
            conf = Conf()
            sparkContext = Context()

        return Spark()


def _start(monkeypatch: pytest.MonkeyPatch, submitted: bool, master: str | None,
           submit_master: str = "local[*]") -> Built:
    built = Built(started_master=submit_master)

    class FakeSession:
        builder = built

    monkeypatch.setattr("pyspark.sql.SparkSession", FakeSession)
    monkeypatch.delenv("SA_CONF", raising=False)
    if submitted:
        monkeypatch.setenv(session.SUBMIT_GATEWAY, "12345")
    else:
        monkeypatch.delenv(session.SUBMIT_GATEWAY, raising=False)
    monkeypatch.setenv("SPARK_CONF_DIR", "/given")  # (setdefault: not changed)
    monkeypatch.setenv("PYSPARK_PYTHON", "/given/python")
    session.spark_session(master=master)
    return built


def test_under_spark_submit_its_master_is_kept(monkeypatch: pytest.MonkeyPatch) -> None:
    """docs/chaos.md's step 3: the checker given no --master runs on spark-submit's,
    and a local one gets the small-machine settings at run time (4 partitions, no AQE)."""
    built = _start(monkeypatch, submitted=True, master=None, submit_master="local[1]")
    assert built.masters == []
    assert "spark.sql.shuffle.partitions" not in built.settings
    assert built.runtime == {"spark.sql.shuffle.partitions": "4",
                             "spark.sql.adaptive.enabled": "false"}


def test_under_spark_submit_a_cluster_master_keeps_its_own_defaults(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    built = _start(monkeypatch, submitted=True, master=None, submit_master="spark://m:7077")
    assert built.masters == []
    assert built.runtime == {}
    assert "spark.sql.adaptive.enabled" not in built.settings


def test_under_spark_submit_the_checkers_master_wins(monkeypatch: pytest.MonkeyPatch) -> None:
    """``spark-submit --master local[1] ... --master local[2]``: the builder is given the
    checker's, which Spark applies over spark-submit's (was the second spark-submit of
    test_spark_submit.py: 'local[2]' in its summary)."""
    built = _start(monkeypatch, submitted=True, master="local[2]", submit_master="local[1]")
    assert built.masters == ["local[2]"]
    assert built.settings["spark.sql.shuffle.partitions"] == "4"
    assert built.settings["spark.sql.adaptive.enabled"] == "false"
    assert built.runtime == {}


def test_without_spark_submit_the_default_master_is_local_2(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    built = _start(monkeypatch, submitted=False, master=None)
    assert built.masters == [session.DEFAULT_MASTER] == ["local[2]"]
    assert built.settings["spark.sql.adaptive.enabled"] == "false"
    assert built.settings["spark.ui.enabled"] == "false"
