"""SIGTERM / SIGINT to a cluster member in the middle of its start-up, with real
processes on 127.0.0.1 (README, "Starting and stopping"): a seed restarting on its
ClusterDataDir, as soon as its cluster link is up (Raft about to load its log and dump)
and as soon as its Raft node started (the caches being restored); a non-seed as soon as
its link is up and as soon as it asked a seed for its caches. Each time: exit 0, no
traceback, no process it started left (checked by pid), and started again it catches
up with the others (the same applied position) -- its data directory was left whole.

Each signal is sent once the member's log says it reached the phase (no sleep). ~17 s
here: a cluster of four, and four restarts each waited for until it caught up."""

from __future__ import annotations

import json
import signal
import time
import urllib.request
from pathlib import Path

from cluster_fixture import LocalCluster


def publish(cluster: LocalCluster, index: int, count: int) -> int:
    """``count`` Guaranteed publishes over HTTP, one after another; how many acknowledged."""
    acknowledged = 0
    for k in range(count):
        body = json.dumps({"subject": f"/start/s{k % 5}", "content": "x" * 500,
                           "qos": "guaranteed"}).encode()
        request = urllib.request.Request(f"{cluster.http(index)}/publish", data=body,
                                         method="POST")
        with urllib.request.urlopen(request, timeout=10) as reply:
            acknowledged += json.loads(reply.read())["status"] == "PUBLISH_OK"
    return acknowledged


def wait_logged(cluster: LocalCluster, index: int, text: str, start: int) -> None:
    for _ in range(3000):  # (a guard: 30 s)
        if text in cluster.log(index)[start:]:
            return
        time.sleep(0.01)
    raise AssertionError(f"member {index} never logged {text!r}:\n{cluster.log(index)[start:]}")


def children(pid: int) -> set[int]:
    found: set[int] = set()
    for task in Path(f"/proc/{pid}/task").iterdir():
        found.update(int(p) for p in (task / "children").read_text().split())
    return found


def alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except FileNotFoundError:
        return False
    return state != "Z"


PHASES = [  # (member, the line that starts the phase, the signal)
    (0, "cluster link on", signal.SIGTERM),
    (0, "Raft node", signal.SIGINT),
    (3, "cluster link on", signal.SIGINT),
    (3, "replicating from seed", signal.SIGTERM),
]


def test_a_signal_at_each_phase_of_a_members_start_up(tmp_path: Path) -> None:
    cluster = LocalCluster(tmp_path, members=4, seeds=3, exec_members=True, DrainTime="2",
                           ClusterLogCompactionEntries="100")  # a dump to load, too
    try:
        cluster.start_all()
        cluster.wait_ready(timeout=90)
        assert publish(cluster, 0, 120) > 0
        for index, line, sig in PHASES:
            cluster.kill(index)  # SIGKILL: it restarts on what it left on disk
            assert publish(cluster, 1, 20) > 0  # something to catch up with
            start = len(cluster.log(index))
            cluster.start(index)
            process = cluster.processes[index]
            assert process is not None
            wait_logged(cluster, index, line, start)
            started = children(process.pid)
            process.send_signal(sig)
            assert process.wait(60) == 0, cluster.log(index)[start:]  # (a guard: a hang)
            log = cluster.log(index)[start:]
            print(f"member {index}, {sig.name} at {line!r}:", log[-600:])
            assert "Traceback" not in log
            assert f"{sig.name} received" in log
            assert not [pid for pid in started if alive(pid)], "a child outlived its member"
            cluster.start(index)
            cluster.wait_ready([index], timeout=90)
            cluster.wait_same_applied(range(4))
    finally:
        cluster.stop()
