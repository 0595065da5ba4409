"""``migratory bench`` end to end: real server processes on 127.0.0.1, small N, 0.5 s of
publishing each (the smallest run that counts: speed is never asserted here).

Each pattern must count every message it sent (``counted == expected``, computed
by the bench from what the publisher sent and the subscriptions), write JSON that
matches the schema, and, with ``--plot``, a PNG. One server started here is driven
by URL (so the bench must not start or stop it); one run lets the bench start its
own server; one compares migratory with mosquitto and nats-server.
"""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import jsonschema
import pytest

from migratory.bench.brokers import find_binary
from migratory.bench.loadgen import local_server
from migratory.bench.schema import FILE
from migratory.bench.server_process import ServerProcess, server_stats

SHORT = ["--duration", "0.5", "--drain", "3", "--setup-timeout", "15", "--procs", "2"]


def bench(*args: str, json_path: Path, timeout: float = 60) -> tuple[int, dict[str, Any], str]:
    """Run ``python -m cluster bench ARGS --json FILE``; exit status, the JSON, stdout."""
    done = subprocess.run(
        [sys.executable, "-m", "cluster", "bench", *args, "--json", str(json_path)],
        capture_output=True, timeout=timeout, text=True,
    )
    data = json.loads(json_path.read_text()) if json_path.exists() else {}
    if data:
        jsonschema.validate(data, FILE)
    assert done.returncode in (0, 1), f"bench could not run:\n{done.stdout}\n{done.stderr}"
    return done.returncode, data, done.stdout


@pytest.fixture(scope="module")
def server() -> Iterator[ServerProcess]:
    """A server started by the test, with an MQTT listener; the bench only gets its URL."""
    proc = local_server("tests-bench", [], mqtt=True)
    proc.start()
    try:
        yield proc
    finally:
        proc.stop()


def every_message_counted(result: dict[str, Any], expected: int) -> None:
    assert result["expected"] == expected
    assert result["counted"] == expected
    assert result["all_delivered"] is True
    assert sum(result["hist"].values()) == expected  # every latency went into the histogram


def test_fanout_by_url_counts_every_delivery(server: ServerProcess, tmp_path: Path) -> None:
    code, data, stdout = bench(
        "fanout", "--url", f"ws://127.0.0.1:{server.port}", "--subscribers", "40",
        "--rate", "80", *SHORT, json_path=tmp_path / "out.json",
    )
    (result,) = data["results"]
    assert code == 0, stdout
    assert result["pattern"] == "fan-out"
    assert result["published"]["sent"] == 40
    every_message_counted(result, 40 * 40)
    assert result["target"]["url"] == f"ws://127.0.0.1:{server.port}"
    # the server's process was found by its port: its CPU and RSS are measured
    assert "server" in result["cpu_percent"] and result["server_rss_kib"]["after"] > 0
    assert "fan-out" in stdout and "1,600/1,600" in stdout  # the table
    assert server.proc is not None and server.proc.poll() is None  # not stopped by the bench
    assert server_stats(server.host, server.port) is not None


def test_many_subjects_k_per_subject(server: ServerProcess, tmp_path: Path) -> None:
    code, data, _ = bench(
        "subjects", "--url", f"ws://127.0.0.1:{server.port}", "--subscribers", "60",
        "--per-subject", "3", "--rate", "200", *SHORT, json_path=tmp_path / "out.json",
    )
    (result,) = data["results"]
    assert result["subjects"] == 20
    assert result["published"]["sent"] == 100
    every_message_counted(result, 100 * 3)  # 100 round-robin over 20 subjects, 3 each
    assert result["subscribers_short"] == 0 and result["subscribers_extra"] == 0
    assert code == 0


def test_publish_with_ack_measures_every_ack(server: ServerProcess, tmp_path: Path) -> None:
    code, data, _ = bench(
        "ack", "--url", f"ws://127.0.0.1:{server.port}", "--rate", "600", *SHORT,
        json_path=tmp_path / "out.json",
    )
    (result,) = data["results"]
    assert result["published"]["statuses"] == {"PUBLISH_OK": 300}
    every_message_counted(result, 300)
    lat = result["latency_ms"]
    assert 0 < lat["p50"] <= lat["p99"] <= lat["p99.9"] <= lat["max"]
    assert code == 0


def test_mqtt_publisher_and_subscribers_on_the_servers_mqtt_listener(
    server: ServerProcess, tmp_path: Path
) -> None:
    code, data, stdout = bench(
        "fanout", "--url", f"ws://127.0.0.1:{server.port}",
        "--mqtt", f"mqtt://127.0.0.1:{server.mqtt_port}", "--front-end", "mqtt",
        "--publisher", "mqtt", "--subscribers", "20", "--rate", "60", *SHORT,
        json_path=tmp_path / "out.json",
    )
    (result,) = data["results"]
    every_message_counted(result, 20 * 30)
    assert result["published"]["statuses"] == {"PUBACK": 30}  # QoS 1, acknowledged
    assert "mqtt/mqtt" in stdout
    assert code == 0


def test_idle_connections_memory_per_connection(server: ServerProcess, tmp_path: Path) -> None:
    code, data, _ = bench(
        "idle", "--url", f"ws://127.0.0.1:{server.port}", "--connections", "200",
        "--hold", "0.5", "--setup-timeout", "20", json_path=tmp_path / "out.json",
    )
    (result,) = data["results"]
    assert result["opened"] == 200 and result["held"]["open"] == 200
    assert result["counted"] == 200  # every session answered the ping after the hold
    assert result["kib_per_connection"] is not None and result["kib_per_connection"] > 0
    assert result["server_open_connections"]["held"] >= 200
    assert code == 0


def test_idle_connections_asking_for_heartbeats_get_them(
    server: ServerProcess, tmp_path: Path
) -> None:
    # (the server's ClientHeartbeatMinimum is 1000: 200 sessions, 2.5 s, two each)
    code, data, stdout = bench(
        "idle", "--url", f"ws://127.0.0.1:{server.port}", "--connections", "200",
        "--hold", "2.5", "--heartbeat", "1000", "--setup-timeout", "20",
        json_path=tmp_path / "out.json",
    )
    (result,) = data["results"]
    assert result["heartbeat_ms"] == 1000
    assert result["held"]["open"] == 200
    assert result["held"]["frames"]["heartbeat"] >= 200  # each idle session had one
    assert result["counted"] == 200  # a heartbeat is not taken for the ping's answer
    assert "server" in result["hold_cpu_percent"] and "heartbeat asked: 1000" in stdout
    assert code == 0


def test_local_server_json_and_plot(tmp_path: Path) -> None:
    plot = tmp_path / "latency.png"
    code, data, stdout = bench(
        "fanout", "--subscribers", "10", "--rate", "100", "--plot", str(plot), *SHORT,
        json_path=tmp_path / "out.json",
    )
    (result,) = data["results"]
    every_message_counted(result, 500)
    assert result["target"]["name"] == "migratory"
    assert result["server_log"]["returncode"] == 0  # the bench stopped its server cleanly
    assert plot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and plot.stat().st_size > 5000
    assert code == 0, stdout


@pytest.mark.parametrize("front_end", ["native", "sse", "mqtt"])
def test_tls_subscribers_on_every_front_end(front_end: str, tmp_path: Path) -> None:
    """``--tls``: the bench's own CA, the local server's encrypted listener, and
    subscribers that decrypt on memory buffers (wss://, https://, mqtts://); every
    delivery counted."""
    code, data, stdout = bench(
        "fanout", "--front-end", front_end, "--tls", "--subscribers", "10", "--rate", "60",
        *SHORT, json_path=tmp_path / "out.json",
    )
    (result,) = data["results"]
    every_message_counted(result, 300)
    assert result["setup_failures"] == {}
    assert "load_cpu_us_per_delivery" in result  # None when the processes used < 1 tick
    assert code == 0, stdout


@pytest.mark.skipif(
    find_binary("mosquitto") is None or find_binary("nats-server") is None,
    reason="mosquitto / nats-server not installed (make test installs them)",
)
def test_compare_with_mosquitto_and_nats(tmp_path: Path) -> None:
    code, data, stdout = bench(
        "fanout", "--compare", "--subscribers", "10", "--rate", "40", *SHORT,
        json_path=tmp_path / "out.json", timeout=90,
    )
    names = [r["target"]["name"] for r in data["results"]]
    assert names == ["migratory", "mosquitto", "nats-server"], stdout
    for result in data["results"]:
        every_message_counted(result, 200)
    brokers = data["results"][1:]
    assert all(r["target"]["url"].startswith("mqtt://127.0.0.1:") for r in brokers)
    assert all(r["published"]["statuses"] == {"PUBACK": 20} for r in brokers)
    assert all("server" in r["cpu_percent"] for r in data["results"])  # measured by PID
    for name in names:
        assert name in stdout
    assert code == 0
