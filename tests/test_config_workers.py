"""The Workers key: default, range, and the combinations refused (docs/workers.md)."""

from __future__ import annotations

import subprocess
import sys

import pytest

from migratory.config import Config, ConfigError

CLUSTER = {
    "ClusterMembers": "127.0.0.1:9100, 127.0.0.1:9110, 127.0.0.1:9120",
    "ClusterMemberListen": "127.0.0.1:9110",
    "ClusterPassword": "s3cret-s3cret",
}


def test_one_worker_by_default() -> None:
    assert Config.defaults().workers == 1
    assert Config.from_mapping({"Workers": "8"}).workers == 8


@pytest.mark.parametrize("value", ["0", "-1", "two", "1.5", "257", "", "\u0662", "\uff12"])
def test_a_bad_worker_count_is_refused_naming_the_key(value: str) -> None:
    """('\u0662' and '\uff12' are an Arabic-Indic and a fullwidth two: Python's int()
    reads any script's digits, and they were taken as Workers = 2.)"""
    with pytest.raises(ConfigError, match="Workers"):
        Config.from_mapping({"Workers": value})


@pytest.mark.parametrize("mode", ["Standard", "Guaranteed"])
def test_workers_in_a_cluster_member_are_refused(mode: str) -> None:
    settings = {**CLUSTER, "ClusterDeliveryMode": mode, "ClusterDataDir": "/var/lib/m"}
    if mode == "Standard":
        del settings["ClusterDataDir"]
    assert Config.from_mapping({**settings, "Workers": "1"}).workers == 1
    refused = r"Workers \(from setting\) = 2 with ClusterMembers \(from setting\): a cluster"
    with pytest.raises(ConfigError, match=refused):
        Config.from_mapping({**settings, "Workers": "2"})


def test_workers_in_a_member_of_a_templated_cluster_are_refused_naming_the_template() -> None:
    """A StatefulSet's member names its cluster with ClusterMemberTemplate, not
    ClusterMembers: the refusal named ClusterMembers, a key the operator never set."""
    settings = {"ClusterMemberTemplate": "migratory-{ordinal}.members:9800",
                "ClusterMemberCount": "3", "ClusterMemberOrdinal": "1",
                "ClusterPassword": "s3cret-s3cret"}
    assert Config.from_mapping(settings).workers == 1
    refused = (r"Workers \(from setting\) = 2 with ClusterMemberTemplate \(from setting\): "
               "a cluster member runs one process")
    with pytest.raises(ConfigError, match=refused):
        Config.from_mapping({**settings, "Workers": "2"})


def test_serve_refuses_workers_in_a_cluster_before_starting_anything() -> None:
    args = [sys.executable, "-m", "cluster", "serve", "--set", "Listen=127.0.0.1:0",
            "--set", "Workers=3"]
    for key, value in CLUSTER.items():
        args += ["--set", f"{key}={value}"]
    result = subprocess.run(args, capture_output=True, text=True, timeout=30)
    assert result.returncode == 2
    assert "configuration error: Workers (from --set) = 3 with ClusterMembers" in result.stderr
    assert "Traceback" not in result.stderr


@pytest.mark.parametrize(
    ("monitor", "refused"),
    [
        ("127.0.0.1:65534", r"MonitorListen \(from setting\) 127.0.0.1:65534 with Workers = 3: "
                            r"worker i answers on port 65534 \+ i, up to 65536, past 65535"),
        ("127.0.0.1:8798", r"MonitorListen \(from setting\) 127.0.0.1:8798 with Workers = 3: "
                           r"worker 2 would answer on 127.0.0.1:8800, a client listener"),
    ],
)
def test_monitoring_ports_of_the_workers_are_checked_at_start_up(
    monitor: str, refused: str
) -> None:
    """Worker i answers MonitorListen's port + i: a port past 65535 or a client port
    among them stopped only that worker's start-up, naming a port nobody configured
    ('MonitorListen: ... got 65536', 'worker 2 stopped during start-up')."""
    settings = {"Listen": "127.0.0.1:8800", "ListenMqtt": "127.0.0.1:8803"}
    assert Config.from_mapping({**settings, "MonitorListen": monitor}).workers == 1
    assert Config.from_mapping({**settings, "MonitorListen": "127.0.0.1:0",
                                "Workers": "3"}).workers == 3
    with pytest.raises(ConfigError, match=refused):
        Config.from_mapping({**settings, "MonitorListen": monitor, "Workers": "3"})


def test_worker_hang_time_is_checked_naming_the_key() -> None:
    """A worker beats every 0.5 s: 1 s would kill healthy workers whose beat is late."""
    assert Config.defaults().worker_hang_time == 10
    assert Config.from_mapping({"WorkerHangTime": "0"}).worker_hang_time == 0
    assert Config.from_mapping({"WorkerHangTime": "2"}).worker_hang_time == 2
    for value in ("1", "-1", "ten", ""):
        with pytest.raises(ConfigError, match="WorkerHangTime"):
            Config.from_mapping({"WorkerHangTime": value})
