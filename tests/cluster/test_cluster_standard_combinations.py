"""Standard mode attacked with combinations of faults, real member processes: each
subscriber's acknowledged messages delivered, or announced by a ``DATA_RESYNC`` in their
window (after the last message of their sender it got before them, before the first
after), never twice or out of order on one lineage (``standard_streams.check``). After
the faults every member's publisher goes on, so that a loss at the end of a killed
sender's life is shown by its next life's forwards."""

from __future__ import annotations

import signal
import threading
import time
from pathlib import Path

from cluster_fixture import LocalCluster
from standard_streams import (
    FAILOVER,
    StreamPublisher,
    StreamSubscriber,
    check,
    resyncs,
    wait_until_got,
)
from tcp_gate import TcpGate
from test_cluster_standard import _forwarding
from whole_outage import power_cut, start_in_order

SUBJECT = "/Stocks/NYSE/IBM"


def _three(tmp_path: Path, gated: tuple[int, ...] = ()) -> tuple[LocalCluster, list[TcpGate]]:
    """Three Standard members, the link port of each of ``gated`` behind a
    :class:`TcpGate` (the forwards into that member pass it)."""
    cluster = LocalCluster(tmp_path, members=3, mode="Standard")
    gates = []
    for i in gated:
        listen = int(cluster.settings[i]["ClusterMemberListen"].rsplit(":", 1)[1])
        cluster.settings[i]["ClusterMemberBind"] = f"127.0.0.1:{cluster.base + 2000 + i}"
        gates.append(TcpGate(listen, cluster.base + 2000 + i))
    cluster.start_all()
    cluster.wait_ready()
    _forwarding(cluster, [0, 1, 2])
    return cluster, gates


def _not_forwarding_to(cluster: LocalCluster, members: list[int], target: int) -> None:
    """Until each of ``members`` says its link to ``target`` is down."""
    name = cluster.settings[target]["ClusterMemberListen"]
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        if all(name not in cluster.status(i)["forwarding_to"] for i in members):
            return
        time.sleep(0.05)
    raise TimeoutError(f"still forwarding to {name}")


class Streams:
    """Publishers on some members, subscribers on others, each stopped by its own event
    (the publishers first: the subscribers then get what is still on its way)."""

    def __init__(self, cluster: LocalCluster, publishing: list[int], subscribing: list[int],
                 rate: float) -> None:
        self.cluster = cluster
        self.publishing, self.receiving = threading.Event(), threading.Event()
        self.subscribers = [
            StreamSubscriber(cluster, [i, *[j for j in range(3) if j != i]], SUBJECT,
                             self.receiving)
            for i in subscribing]
        for subscriber in self.subscribers:
            subscriber.start()
            assert subscriber.subscribed.wait(10)
        self.publishers = [StreamPublisher(cluster, i, "abc"[i], SUBJECT, rate,
                                           self.publishing) for i in publishing]
        for publisher in self.publishers:
            publisher.start()

    def stop(self) -> None:
        self.publishing.set()
        self.receiving.set()

    def finish(self) -> None:
        """Every member ready and forwarding again, the load on for 2 s more (each
        sender speaks again), then stopped; every subscriber held to the rules."""
        cluster, publishers, subscribers = self.cluster, self.publishers, self.subscribers
        cluster.wait_ready()
        _forwarding(cluster, [0, 1, 2])
        time.sleep(2)
        self.publishing.set()
        for publisher in publishers:
            publisher.join(15)
        wait_until_got(subscribers, publishers)
        self.receiving.set()
        for subscriber in subscribers:
            subscriber.join(15)
        acked = {p.name: p.acked for p in publishers}
        seconds = max(p.seconds for p in publishers)
        print(f"acked {sum(map(len, acked.values()))} in {seconds:.1f} s "
              f"({sum(map(len, acked.values())) / seconds:.0f}/s): "
              f"{ {p.name: len(p.acked) for p in publishers} }, outcome unknown "
              f"{ {p.name: p.unknown for p in publishers} }")
        for subscriber in subscribers:
            result = check(subscriber.events, acked)
            got = subscriber.got()
            lost = sum(len(set(numbers) - {g.number for g in got if g.sender == name})
                       for name, numbers in acked.items())
            print(f"  subscriber from member {subscriber.members[0]}: {len(got)} got, "
                  f"{lost} acked not got (announced), {resyncs(subscriber)} DATA_RESYNC, "
                  f"{subscriber.events.count(FAILOVER)} failovers")
            assert result.ok(), result
            assert {g.sender for g in got} == set(acked)


def test_a_member_killed_while_another_restarts(tmp_path: Path) -> None:
    """C's link port cut (A's and B's forwards to C wait in their queues); A drained
    (SIGTERM) and started again; while it starts, B SIGKILLed and started; C's link port
    open again. Both queues died with their processes: C's subscriber (never moved) must
    be told before each sender's next message, and A's (failed over) keep the rules."""
    cluster, (gate,) = _three(tmp_path, gated=(2,))
    streams = None
    try:
        streams = Streams(cluster, [0, 1], [2, 0], 40)
        time.sleep(1.5)
        gate.close_gate(reset_open=True)
        _not_forwarding_to(cluster, [0, 1], 2)
        time.sleep(0.5)  # acknowledged, queued for C
        cluster.kill(0, signal.SIGTERM)  # A drains
        cluster.start(0)
        time.sleep(0.3)  # A starting
        cluster.kill(1)
        cluster.start(1)
        gate.open_gate()
        streams.finish()
        assert resyncs(streams.subscribers[0]) >= 2  # one per sender's lost queue at least
    finally:
        if streams is not None:
            streams.stop()
        cluster.stop()
        gate.shutdown()


def test_a_subject_subscribed_on_every_member_while_one_is_killed(tmp_path: Path) -> None:
    """A subscriber and a publisher on each member; A's and C's link ports cut (every
    forward into them waits, B's too), B SIGKILLed with its queues and restarted (its
    subscriber fails over to C), the ports open again: A's and C's subscribers are told
    of B's lost forwards before B's next; A's and C's forwards to each other (their links
    reset) arrive or are announced."""
    cluster, gates = _three(tmp_path, gated=(0, 2))
    streams = None
    try:
        streams = Streams(cluster, [0, 1, 2], [0, 1, 2], 30)
        time.sleep(1.5)
        for gate in gates:
            gate.close_gate(reset_open=True)
        _not_forwarding_to(cluster, [1], 0)
        _not_forwarding_to(cluster, [1], 2)
        time.sleep(0.5)  # acknowledged by B, queued for A and C
        cluster.kill(1)
        cluster.start(1)
        for gate in gates:
            gate.open_gate()
        streams.finish()
    finally:
        if streams is not None:
            streams.stop()
        cluster.stop()
        for gate in gates:
            gate.shutdown()


def test_three_members_restarted_in_turn_under_200_a_second(tmp_path: Path) -> None:
    """A publisher on each member, ~67/s each; a subscriber on each member; each member
    drained (SIGTERM) and started again in turn, the next once it is ready."""
    cluster, _ = _three(tmp_path)
    streams = None
    try:
        streams = Streams(cluster, [0, 1, 2], [0, 1, 2], 67)
        time.sleep(1)
        for i in range(3):
            cluster.kill(i, signal.SIGTERM)
            cluster.start(i)
            cluster.wait_ready([i])
            _forwarding(cluster, [0, 1, 2])
            time.sleep(0.5)
        streams.finish()
    finally:
        if streams is not None:
            streams.stop()
        cluster.stop()


def test_every_member_killed_at_once_twice_under_load(tmp_path: Path) -> None:
    """A power cut (every member SIGKILLed at once, queues and all) under a publisher and
    a subscriber on each member, the members started again in reverse order, and cut
    again 0.8 s later: whatever a subscriber missed is announced (2-4 DATA_RESYNC each,
    0-17 acknowledged messages missed, in 3 runs when written; it held)."""
    cluster, _ = _three(tmp_path)
    streams = None
    try:
        streams = Streams(cluster, [0, 1, 2], [0, 1, 2], 40)
        time.sleep(1.5)
        power_cut(cluster)
        start_in_order(cluster, [2, 1, 0], gap=0.5)
        time.sleep(0.8)
        power_cut(cluster)
        cluster.start_all()
        streams.finish()
    finally:
        if streams is not None:
            streams.stop()
        cluster.stop()
