"""The bench's pieces without a server: counting verdicts, URLs, table, schema, progress bar."""

from __future__ import annotations

import argparse
import io
import os
import socket
from typing import Any

import jsonschema
import pytest

from migratory.bench.cli import main
from migratory.bench.fanout_report import loop_gap_in_window, summarise
from migratory.bench.latency import BUCKET_NS
from migratory.bench.output import table
from migratory.bench.procfs import pid_listening_on
from migratory.bench.progress import Progress
from migratory.bench.schema import FILE
from migratory.bench.target import TargetError, target_from_url


def figures(per_subscriber: list[int], sent: int) -> dict[str, Any]:
    """What the load processes report: one subscriber process with these counts."""
    expected = sent
    hist = {15: sum(per_subscriber)}  # every delivery at 1.5 ms
    return {
        "published": {"sent": sent, "seconds": 1.0, "acks": sent, "unanswered": 0,
                      "ack_ms": {}, "ack_hist": {}},
        "results": [{
            "received": sum(per_subscriber),
            "hist": hist,
            "max_ns": 16 * BUCKET_NS,
            "per_conn_delta": {n - expected: 1 for n in per_subscriber},
            "closes": {},
            "recvs": 1,
            "polls": 1,
        }],
        "cpu": {"machine": 1.0},
        "subscribed": len(per_subscriber),
        "setup_failures": {},
        "setup_seconds": 0.1,
        "rss_before": None,
        "rss_after": None,
        "stats_before": {},
        "stats_after": {},
    }


def args(subscribers: int) -> argparse.Namespace:
    return argparse.Namespace(
        subjects=1, subscribers=subscribers, pattern="fan-out", front_end="native",
        publisher="native", set=[],
        rate=10.0, size=100, duration=1.0, procs=1, target_p99=None,
    )


def test_every_message_counted_passes() -> None:
    result = summarise(args(3), figures([10, 10, 10], sent=10))
    assert (result["counted"], result["expected"]) == (30, 30)
    assert result["all_delivered"] and result["pass"]
    assert result["latency_ms"]["p50"] == pytest.approx(1.6)


@pytest.mark.parametrize("counts", [[10, 9, 10], [10, 11, 9], [10, 10]])
def test_a_missing_or_doubled_delivery_fails(counts: list[int]) -> None:
    # one short; one over and one short (the total is right); one subscriber never subscribed
    result = summarise(args(3), figures(counts, sent=10))
    assert not result["all_delivered"] and not result["pass"]


def test_p99_target() -> None:
    slow = argparse.Namespace(**{**vars(args(3)), "target_p99": 1.0})
    assert not summarise(slow, figures([10, 10, 10], sent=10))["pass"]


def test_urls() -> None:
    ws = target_from_url("ws://127.0.0.1:8899", pid=1)
    assert (ws.protocol, ws.host, ws.port, ws.stats) == ("native", "127.0.0.1", 8899, True)
    mqtt = target_from_url("mqtt://localhost", pid=1)
    assert (mqtt.protocol, mqtt.port, mqtt.stats) == ("mqtt", 1883, False)
    assert mqtt.port_for("mqtt") == 1883
    with pytest.raises(TargetError, match="MQTT broker"):
        mqtt.port_for("native")
    with pytest.raises(TargetError, match="--mqtt"):
        ws.port_for("mqtt")
    with pytest.raises(TargetError, match="http://x"):
        target_from_url("http://x:1")


def test_the_server_process_is_found_by_its_port() -> None:
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen()
        port = listener.getsockname()[1]
        assert pid_listening_on(port) == os.getpid()
    assert pid_listening_on(port) == 0


def test_workers_are_found_through_their_supervisor() -> None:
    """Workers = N: only the workers hold the port; the bench must find their parent.

    The workers are subprocesses handed the listening socket (``pass_fds``), not forks:
    once any test of this process has built a Raft node, every ``os.fork`` child closes
    its sockets at once (cluster/dump_fork.py, for pysyncobj's dump writer), and a run
    in another order failed here."""
    import subprocess
    import sys

    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen()
    port = listener.getsockname()[1]
    workers = [
        subprocess.Popen([sys.executable, "-c", "import time; time.sleep(10)"],
                         pass_fds=(listener.fileno(),))
        for _ in range(2)
    ]
    listener.close()
    try:
        assert pid_listening_on(port) == os.getpid()
    finally:
        for worker in workers:
            worker.kill()
            worker.wait(5)


def test_bad_options_name_the_option(capsys: pytest.CaptureFixture[str]) -> None:
    for argv, word in (
        (["ack", "--subscribers", "5"], "no subscribers"),
        (["fanout", "--subscribers", "5", "--subjects", "6"], "--subjects"),
        (["fanout", "--size", "10"], "--size"),
        (["idle", "--mqtt", "mqtt://127.0.0.1:1"], "idle"),
    ):
        with pytest.raises(SystemExit) as exc:
            main(argv)
        assert exc.value.code == 2
        assert word in capsys.readouterr().err
    assert main(["fanout", "--url", "mqtt://127.0.0.1:1"]) == 2  # a broker is --mqtt
    assert "--mqtt" in capsys.readouterr().err


def test_table_and_schema() -> None:
    result = summarise(args(3), figures([10, 10, 10], sent=10))
    result.update(target={"name": "migratory", "url": "ws://127.0.0.1:1"},
                  machine={"nproc": "2", "cpu": "x"})
    text = table([result])
    assert "migratory" in text and "30/30" in text and "fan-out" in text
    jsonschema.validate({"schema": 1, "results": [result]}, FILE)
    del result["counted"]
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate({"schema": 1, "results": [result]}, FILE)


def test_progress_bar_only_on_a_terminal() -> None:
    quiet = io.StringIO()
    Progress(10, "run", stream=quiet).update(5)
    assert quiet.getvalue() == ""  # a StringIO is not a TTY
    shown = io.StringIO()
    bar = Progress(10, "run", stream=shown, enabled=True)
    bar.update(5)
    assert "[###############...............]   5.0/10 s  run" in shown.getvalue()


def test_server_and_load_generator_cpu_per_delivery() -> None:
    """Both sides of a delivery in CPU microseconds: the server's over what it fanned
    out, the subscriber processes' (not the publisher's) over what they counted."""
    measured = figures([10, 10, 10], sent=10)
    measured["cpu"] = {"server": 50.0, "subscribers-0": 30.0, "subscribers-1": 10.0,
                       "publisher": 90.0, "machine": 100.0, "wall_seconds": 2.0}
    measured["stats_after"] = {"frames_fanned_out": 30}
    result = summarise(args(3), measured)
    assert result["server_cpu_us_per_delivery"] == pytest.approx(0.5 * 2.0 * 1e6 / 30)
    assert result["load_cpu_us_per_delivery"] == pytest.approx(0.4 * 2.0 * 1e6 / 30)
    assert summarise(args(3), figures([10, 10, 10], sent=10))["load_cpu_us_per_delivery"] is None


def test_the_loop_stall_counts_only_seconds_inside_the_publishing_window() -> None:
    """The set-up's gap in the second the window opens in is not the run's stall (it was
    reported as one: 107 ms for a run whose slowest delivery took 16 ms)."""
    stats = {"loop_gaps": {"per_second": [
        (99, 54.9), (100, 107.3), (101, 4.9), (102, 10.6), (103, 5.1), (104, 80.0)]}}
    assert loop_gap_in_window(stats, (100.89, 104.2)) == 10.6
    assert loop_gap_in_window(stats, (100.89, 101.5)) == 107.3  # no whole second: all
    assert loop_gap_in_window({}, (100.0, 110.0)) is None
