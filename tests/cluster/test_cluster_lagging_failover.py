"""Issue 8: failover to a peer that is behind, with real member processes under load.

A follower seed is paused (SIGSTOP) for 3 s, then resumed while the leader is
SIGKILLed: the non-seeds fail over to the lagging seed, which has applied less than
they have. Before the fix they installed its older cache sync (``ValueError``: "sync
at clsn ... is older than applied ...") and exited 1. A member must wait for that
peer to catch up (or pick another), never install backwards, never exit.

Which seed a non-seed dials next is random, so the test steers them: the seeds bind
behind gates (:mod:`tcp_gate`), and the gate of the seed that is neither paused nor
the leader is closed during the failover; a non-seed can then only land on the
lagging seed. The lagging seed's own log shows it ("ahead: live only"). The seeds' Raft
gates are closed from the resume until the non-seeds came, so the lagging seed is still
behind when they do (it caught up first in about one run of five otherwise).
"""

from __future__ import annotations

import re
import signal
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from cluster_fixture import LocalCluster
from cluster_load import LoadPublisher, LoadSubscriber, delivery_problems
from gated_seeds import SEEDS, seed_index, started_behind_gates
from tcp_gate import TcpGate

from migratory.protocol import ops

NON_SEEDS = [3, 4]
PAUSE = 3.0
BAD_LOG_LINES = ("Traceback", "older than applied")


@pytest.fixture
def gated_cluster(tmp_path: Path) -> Iterator[tuple[LocalCluster, dict[int, list[TcpGate]]]]:
    cluster = LocalCluster(tmp_path, members=5, seeds=3)
    with started_behind_gates(cluster) as gates:
        yield cluster, gates


@pytest.mark.slow
def test_non_seeds_failing_over_to_a_lagging_seed_wait_for_it(
    gated_cluster: tuple[LocalCluster, dict[int, list[TcpGate]]],
) -> None:
    cluster, gates = gated_cluster
    leader = cluster.leader()
    followers = [i for i in SEEDS if i != leader]
    upstreams = {seed_index(cluster, cluster.status(n)["replicating_from"]) for n in NON_SEEDS}
    # the non-seeds on the paused seed leave it for the leader (the other one is gated)
    lagging = next((f for f in followers if f in upstreams), followers[0])
    other = next(f for f in followers if f != lagging)
    subscribers = [LoadSubscriber([cluster.port(n)], tag=f"sub{n}") for n in NON_SEEDS]
    for subscriber in subscribers:
        subscriber.start()
        subscriber.wait_subscribed(10)
    publisher = LoadPublisher([cluster.port(other)], rate=1500, duration=35)
    publisher.start()
    publisher.wait_acked(2000, timeout=10)

    gates[other][0].close_gate(reset_open=True)
    paused = cluster.processes[lagging]
    assert paused is not None
    paused.send_signal(signal.SIGSTOP)
    time.sleep(PAUSE)
    log_start = len(cluster.log(lagging))
    # no Raft between the seeds until the non-seeds came: the lagging seed stays behind
    # (a commit batch holds hundreds of publishes, so it caught up in well under the
    # second the non-seeds take to come back: the scenario failed to form 1 run in 5)
    for i in SEEDS:
        gates[i][1].close_gate(reset_open=True)
    paused.send_signal(signal.SIGCONT)
    cluster.kill(leader)
    lagging_name = cluster.settings[lagging]["ClusterMemberListen"]
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        if all(cluster.status(n)["replicating_from"] == lagging_name for n in NON_SEEDS):
            break
        time.sleep(0.2)
    for i in SEEDS:
        gates[i][1].open_gate()
    gates[other][0].open_gate()
    time.sleep(2)
    publisher.stop()
    live = [i for i in range(5) if i != leader]

    assert cluster.exited() == {leader: -signal.SIGKILL}, "a member exited on its own"
    cluster.wait_ready(live, timeout=20)
    cluster.wait_same_applied(live)
    served_ahead = re.findall(
        r"replicating to (\S+) from clsn (\d+) \(ahead: live only; here (\d+)\)",
        cluster.log(lagging)[log_start:],
    )
    assert served_ahead, "no non-seed failed over to the lagging seed while it was behind"
    acked = publisher.acked_messages()
    assert len(publisher.acked) > 5000, publisher.summary()
    for subscriber in subscribers:
        subscriber.wait_for({c for messages in acked.values() for c, _ in messages}, 20)
        subscriber.stop()
        assert delivery_problems(subscriber.messages(), acked) == []
        assert subscriber.statuses(ops.Status.DATA_RESYNC) == []
    for i in range(5):
        text = cluster.log(i)
        assert not [bad for bad in BAD_LOG_LINES if bad in text], f"member {i}:\n{text[-3000:]}"
    print(f"lagging seed served {served_ahead}; {publisher.summary()}")
