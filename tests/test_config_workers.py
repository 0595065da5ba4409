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


@pytest.mark.parametrize("value", ["0", "-1", "two", "1.5", "257", ""])
def test_a_bad_worker_count_is_refused_naming_the_key(value: str) -> None:
    with pytest.raises(ConfigError, match="Workers"):
        Config.from_mapping({"Workers": value})


@pytest.mark.parametrize("mode", ["Standard", "Guaranteed"])
def test_workers_in_a_cluster_member_are_refused(mode: str) -> None:
    settings = {**CLUSTER, "ClusterDeliveryMode": mode, "ClusterDataDir": "/var/lib/m"}
    if mode == "Standard":
        del settings["ClusterDataDir"]
    assert Config.from_mapping({**settings, "Workers": "1"}).workers == 1
    refused = r"Workers \(from setting\) = 2 with ClusterMembers: a cluster member"
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
