"""Issue 8: failover to a peer that is behind, with real member processes under load.

A follower seed is paused (SIGSTOP), then resumed while the leader is SIGKILLed: the
non-seeds fail over to the lagging seed, which has applied less than they have. Before
the fix they installed its older cache sync (``ValueError``: "sync at clsn ... is older
than applied ...") and exited 1. A member must wait for that peer to catch up (or pick
another), never install backwards, never exit.

Which seed a non-seed dials next is random, so the test steers them: the seeds bind
behind gates (:mod:`tcp_gate`), and at the failover the gate of the seed that is neither
paused nor the leader is closed; a non-seed can then only land on the lagging seed. The
lagging seed's own log shows it ("ahead: live only"). The seeds' Raft gates are closed
from the resume until the non-seeds came, so the lagging seed is still behind when they
do (it caught up first in about one run of five otherwise).

The scenario is waited for, not timed. The follower stays paused until neither non-seed
replicates from it and both are two commits past what the leader had applied at the
pause (:func:`wait_ahead`): a non-seed on the paused seed leaves it after
``UPSTREAM_SILENCE`` (2 s), and a fixed 3 s pause left it one second to link to another
seed and get ahead -- on a busy box both non-seeds were sometimes still dialling when
the leader was killed, came back to the resumed seed at its own clsn ("live; here 9")
and the test failed with "no non-seed failed over to the lagging seed". The other
seed's gate stays open until the failover: closed at the pause, a non-seed it reset
could dial the paused seed next, which took the TCP dial and held the non-seed (then
~13 s, the handshake's limit and the TLS question after it; 2 s since 95dbc16), a gap
in its subscriber's stream longer than the cache. The leader and the lagging seed are
chosen once the load flows (an election at the load's start moved the leader onto the
seed the test then paused), and the leader must still lead, in the same term, when it
is killed; a scenario that did not form says so ("the scenario did not form"), apart
from the product's failures.
"""

from __future__ import annotations

import re
import signal
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from cluster_fixture import LocalCluster
from cluster_load import LoadPublisher, LoadSubscriber, delivery_problems
from gated_seeds import SEEDS, seed_index, started_behind_gates
from tcp_gate import TcpGate
from zygote_process import MemberProcess

from cluster.raft_timings import SILENT_LINK_TIMEOUTS
from migratory.protocol import ops

NON_SEEDS = [3, 4]
STEADY_LEADER = "400"
"""ClusterElectionTimeout (ms): at the default 150 a journal sync or a Raft thread held
0.2-0.4 s on the busy box elected another leader under the load (then the leader chosen
was paused, or the publisher's seed led)."""
PAUSE = 3.0
"""At least this long, and longer than a Raft link's silence limit (ClusterElectionTimeout
x SILENT_LINK_TIMEOUTS: 2.7 s): resumed, the lagging seed drops its Raft links without
reading what the leader sent it meanwhile."""
AHEAD_BY = 2
"""Commits past the leader's applied clsn at the pause the non-seeds reach before the
lagging seed is resumed (the leader's trio side may apply a commit after a follower's)."""
AHEAD_TIMEOUT = 20.0
SUBSCRIBED = 120.0
"""The subscribers' time limit (they are stopped at the end): at 40 s they stopped
before the check on a busy box (pause, failover, readiness and catch-up up to 40 s)."""
BAD_LOG_LINES = ("Traceback", "older than applied")


@pytest.fixture
def gated_cluster(tmp_path: Path) -> Iterator[tuple[LocalCluster, dict[int, list[TcpGate]]]]:
    cluster = LocalCluster(tmp_path, members=5, seeds=3, ClusterElectionTimeout=STEADY_LEADER)
    with started_behind_gates(cluster) as gates:
        yield cluster, gates


@pytest.mark.slow
def test_non_seeds_failing_over_to_a_lagging_seed_wait_for_it(
    gated_cluster: tuple[LocalCluster, dict[int, list[TcpGate]]],
) -> None:
    cluster, gates = gated_cluster
    assert int(STEADY_LEADER) / 1000 * SILENT_LINK_TIMEOUTS < PAUSE
    leader = cluster.leader()
    followers = [i for i in SEEDS if i != leader]
    upstreams = {seed_index(cluster, cluster.status(n)["replicating_from"]) for n in NON_SEEDS}
    # the publisher's seed: not the non-seeds' if it can be (the non-seeds on the paused
    # seed leave it)
    other = next((f for f in followers if f not in upstreams), followers[-1])
    subscribers = [LoadSubscriber([cluster.port(n)], tag=f"sub{n}", duration=SUBSCRIBED)
                   for n in NON_SEEDS]
    for subscriber in subscribers:
        subscriber.start()
        subscriber.wait_subscribed(10)
    publisher = LoadPublisher([cluster.port(other)], rate=1500, duration=35)
    publisher.start()
    publisher.wait_acked(2000, timeout=10)
    leader = cluster.leader()  # again, under the load
    if leader == other:
        pytest.fail(f"the scenario did not form: seed {other}, the publisher's, was elected "
                    "Raft leader as the load started")
    lagging = next(i for i in SEEDS if i not in (leader, other))
    term = cluster.status(leader)["raft_term"]

    paused = cluster.processes[lagging]
    assert paused is not None
    paused.send_signal(signal.SIGSTOP)
    at_pause = cluster.status(leader)["applied_clsn"]
    time.sleep(PAUSE)
    ahead = wait_ahead(cluster, lagging, leader, term, at_pause + AHEAD_BY)
    log_start = len(cluster.log(lagging))
    lagging_name = cluster.settings[lagging]["ClusterMemberListen"]
    came = fail_over(cluster, gates, paused, leader, other, lagging_name)
    time.sleep(2)
    publisher.stop()
    live = [i for i in range(5) if i != leader]

    assert cluster.exited() == {leader: -signal.SIGKILL}, "a member exited on its own"
    cluster.wait_ready(live, timeout=20)
    cluster.wait_same_applied(live)
    served = re.findall(r"replicating to .*", cluster.log(lagging)[log_start:])
    served_ahead = re.findall(
        r"replicating to (\S+) from clsn (\d+) \(ahead: live only; here (\d+)\)",
        "\n".join(served),
    )
    assert served_ahead, (
        f"no non-seed failed over to the lagging seed while it was behind: they were at "
        f"{ahead} on the leader, 10 s after its kill they replicated from {came} (lagging "
        f"seed {lagging_name}), which logged {served}"
    )
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
    print(f"non-seeds ahead {ahead}; lagging seed served {served_ahead}; "
          f"{publisher.summary()}")


def fail_over(cluster: LocalCluster, gates: dict[int, list[TcpGate]],
              paused: MemberProcess, leader: int, other: int,
              lagging_name: str) -> dict[int, Any]:
    """Resume the paused seed and kill the leader, the other seed's gate closed and no
    Raft between the seeds until the non-seeds came to the lagging seed (at most 10 s);
    where they replicate from then.

    (A commit batch holds hundreds of publishes, so the lagging seed caught up in well
    under the second the non-seeds take to come back: the scenario failed to form 1 run
    in 5.)"""
    for i in SEEDS:
        gates[i][1].close_gate(reset_open=True)
    gates[other][0].close_gate(reset_open=True)
    paused.send_signal(signal.SIGCONT)
    cluster.kill(leader)
    deadline, came = time.monotonic() + 10, {}
    while time.monotonic() < deadline:
        came = {n: (polled(cluster, n) or {}).get("replicating_from") for n in NON_SEEDS}
        if all(came[n] == lagging_name for n in NON_SEEDS):
            break
        time.sleep(0.2)
    for i in SEEDS:
        gates[i][1].open_gate()
    gates[other][0].open_gate()
    return came


def wait_ahead(cluster: LocalCluster, lagging: int, leader: int, term: int,
               clsn: int) -> dict[int, int]:
    """Until no non-seed replicates from the paused ``lagging`` seed and each has applied
    ``clsn`` (a non-seed leaves a stopped seed after ``UPSTREAM_SILENCE``); their applied
    clsns. Fails at once, saying the scenario did not form, if ``leader`` no longer leads
    in ``term`` (an election on a busy box)."""
    lagging_name = cluster.settings[lagging]["ClusterMemberListen"]
    deadline = time.monotonic() + AHEAD_TIMEOUT
    while True:
        statuses = {n: polled(cluster, n) or {} for n in NON_SEEDS}
        now = polled(cluster, leader)
        if now is not None and (now["raft_state"], now["raft_term"]) != ("leader", term):
            pytest.fail(f"the scenario did not form: seed {leader} led in term {term} at "
                        f"the pause, is {now['raft_state']} in term {now['raft_term']} now")
        if all(s.get("replicating_from") not in (None, lagging_name)
               and s["applied_clsn"] >= clsn for s in statuses.values()):
            return {n: s["applied_clsn"] for n, s in statuses.items()}
        if time.monotonic() > deadline:
            where = {n: (s.get("replicating_from"), s.get("applied_clsn"))
                     for n, s in statuses.items()}
            raise AssertionError(
                f"the non-seeds did not leave the paused seed {lagging_name} for another and "
                f"apply clsn {clsn} within {AHEAD_TIMEOUT:g} s: {where}"
            )
        time.sleep(0.2)


def polled(cluster: LocalCluster, index: int) -> dict[str, Any] | None:
    """Member ``index``'s ``GET /cluster``, None when it did not answer in time (a loop
    held on a busy box: a poll asks again)."""
    try:
        return cluster.status(index)
    except OSError:
        return None
