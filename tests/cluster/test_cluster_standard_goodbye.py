"""Standard mode with real member processes and a ``ClusterDataDir``: a member drained
by SIGTERM says goodbye to its peers, and its next life names it as its clean
predecessor (cluster/standard_lives.py), so a peer's subscribers are not resynced for
every subject it publishes again -- unless a life between them published and died
without reaching the peer, which must be told."""

from __future__ import annotations

import signal
import sys
import time
from pathlib import Path

from cluster_fixture import LocalCluster
from tcp_gate import TcpGate
from test_cluster_standard import _forwarding, receive_until
from test_cluster_standard_restart import _publish, _resyncs, announced_m2, killed_and_back

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "server"))
from rawclient import RawClient, delivered

from migratory.protocol import ops

SUBJECT = "/Stocks/NYSE/IBM"


def _pair(tmp_path: Path, *, gated: bool = False) -> tuple[LocalCluster, list[TcpGate]]:
    """Two Standard members, each with its own ClusterDataDir; ``gated``: each one's link
    port behind a :class:`TcpGate` (so neither can reach the other while closed)."""
    cluster = LocalCluster(tmp_path, members=2, mode="Standard")
    gates = []
    for i, settings in enumerate(cluster.settings):
        settings["ClusterDataDir"] = str(tmp_path / "data" / f"member-{i}")
        if gated:
            listen = int(settings["ClusterMemberListen"].rsplit(":", 1)[1])
            settings["ClusterMemberBind"] = f"127.0.0.1:{cluster.base + 2000 + i}"
            gates.append(TcpGate(listen, cluster.base + 2000 + i))
    cluster.start_all()
    cluster.wait_ready()
    _forwarding(cluster, [0, 1])
    return cluster, gates


def subscriber_on(cluster: LocalCluster, index: int, subjects: list[str]) -> RawClient:
    client = RawClient(cluster.port(index))
    client.connect(f"sub-{index}")
    for subject in subjects:
        client.subscribe(subject)
        assert isinstance(client.recv_op(), ops.SubjectStatus)
    return client


def _restart(cluster: LocalCluster, index: int, sig: int = signal.SIGTERM) -> None:
    cluster.kill(index, sig)
    cluster.start(index)
    cluster.wait_ready([index])


def test_a_drained_members_next_life_costs_its_peers_subscribers_no_resync(
    tmp_path: Path,
) -> None:
    """50 subjects each with a subscriber on B, each published through A; A drained
    (SIGTERM) and started again; each published through A again: B's subscriber gets
    every message, no DATA_RESYNC. Before: 50 (one per subject, docs/cluster.md)."""
    cluster, _ = _pair(tmp_path)
    try:
        subjects = [f"/Stocks/S{i:02d}/X" for i in range(50)]
        on_b = subscriber_on(cluster, 1, subjects)
        publisher = RawClient(cluster.port(0))
        publisher.connect("pub")
        for subject in subjects:
            _publish(publisher, subject, b"before")
        assert len(on_b.recv_messages(50, timeout=10)) == 50
        publisher.close()  # (left open, A's drain waits the close linger for it: 5 s)
        _restart(cluster, 0)
        _forwarding(cluster, [0, 1])
        publisher = RawClient(cluster.port(0))
        publisher.connect("pub-again")
        for subject in subjects[:-1]:
            _publish(publisher, subject, b"after")
        _publish(publisher, subjects[-1], b"last")
        received = receive_until(on_b, b"last")
        print(f"after A's drain and restart: {_resyncs(received)} DATA_RESYNC for "
              f"{len(subjects)} subjects")
        assert _resyncs(received) == 0 and cluster.status(1)["forward_gaps"] == 0
        assert [m.content for m in delivered(received)] == [b"after"] * 49 + [b"last"]
        assert "said goodbye to" in cluster.log(0)
        assert "follows the one that said goodbye" in cluster.log(1)
    finally:
        cluster.stop()


def test_a_life_between_that_published_and_died_unseen_is_announced(tmp_path: Path) -> None:
    """The unsafe interleaving: A drained (its goodbye reaches B); A's next life starts
    with both link ports shut (it never reaches B, nor B it), acknowledges SUBJECT's m1
    (queued for B) and is SIGKILLed; the life after starts with the ports open and
    publishes m2. That life names the one between (not ended cleanly), not the drained
    one: B's subscriber is told DATA_RESYNC before m2. A goodbye alone would have chained
    the last life to the drained one: m1 missing, nothing told."""
    cluster, gates = _pair(tmp_path, gated=True)
    try:
        on_b = subscriber_on(cluster, 1, [SUBJECT])
        publisher = RawClient(cluster.port(0))
        publisher.connect("pub")
        _publish(publisher, SUBJECT, b"m0")
        assert delivered(receive_until(on_b, b"m0"))[-1].content == b"m0"
        publisher.close()  # (left open, A's drain waits the close linger for it: 5 s)
        cluster.kill(0, signal.SIGTERM)  # A drains: goodbye to B
        for gate in gates:
            gate.close_gate(reset_open=True)
        deadline = time.monotonic() + 10
        while cluster.status(1)["forwarding_to"] and time.monotonic() < deadline:
            time.sleep(0.05)
        cluster.start(0)  # the life between
        cluster.wait_ready([0])
        publisher = RawClient(cluster.port(0))
        publisher.connect("pub-between")
        _publish(publisher, SUBJECT, b"m1")  # acknowledged; its forward waits in A's queue
        announced_m2(on_b, killed_and_back(cluster, gates))  # the life after publishes m2
    finally:
        cluster.stop()
        for gate in gates:
            gate.shutdown()
