"""Members of 524f73f and of this version in one cluster, as a rolling upgrade (or a
downgrade) leaves them: real processes, 524f73f's from this repository's history
(``old_members.py``). docs/cluster.md, "Upgrading and downgrading", says what these pin.
"""

from __future__ import annotations

import time
from pathlib import Path

import pytest
from cluster_load import LoadPublisher, LoadSubscriber, delivery_problems
from old_members import MixedCluster, unpack_524f73f
from paho_client import PahoClient

from migratory.model.position import Position
from migratory.protocol import ops

UNTAKEN_LINE = "has been sent this leader's dump"


@pytest.fixture(scope="session")
def old_tree(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return unpack_524f73f(tmp_path_factory.mktemp("old"))


def wait_for(what: str, check: object, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while not check():  # type: ignore[operator]
        assert time.monotonic() < deadline, f"not within {timeout} s: {what}"
        time.sleep(0.2)


def leader_of(cluster: MixedCluster, timeout: float = 20) -> int:
    """The Raft leader, once there is one (an election may be under way)."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            return cluster.leader()
        except RuntimeError:
            assert time.monotonic() < deadline, "no Raft leader"
            time.sleep(0.2)


def publish(cluster: MixedCluster, count: int, tag: str,
            acked: dict[str, list[tuple[bytes, Position]]]) -> None:
    """``count`` publishes acknowledged through members 0 and 1 (of this version), added
    to ``acked``."""
    publisher = LoadPublisher([cluster.port(0), cluster.port(1)], rate=200, duration=20,
                              tag=tag)
    publisher.start()
    try:
        publisher.wait_acked(count, 20)
    finally:
        publisher.stop()
    for subject, messages in publisher.acked_messages().items():
        acked.setdefault(subject, []).extend(messages)


def resumes_everything(cluster: MixedCluster, member: int,
                       acked: dict[str, list[tuple[bytes, Position]]]) -> None:
    """A subscriber on ``member`` resuming from before the first message of each subject
    gets every acknowledged one, at its position (``DATA_SYNC``, no resync)."""
    start = {s: Position(m[0][1].epoch, 0) for s, m in acked.items()}
    subscriber = LoadSubscriber([cluster.port(member)], subjects=sorted(acked),
                                positions=start, duration=30, tag=f"on-{member}")
    subscriber.start()
    try:
        subscriber.wait_for({c for m in acked.values() for c, _ in m}, 20)
    finally:
        subscriber.stop()
    assert delivery_problems(subscriber.messages(), acked) == []
    assert not subscriber.statuses(ops.Status.DATA_RESYNC)


def test_a_524f73f_seed_behind_an_upgraded_leader_is_sent_a_dump_it_loads(
    tmp_path: Path, old_tree: Path,
) -> None:
    """Seed 2 still on 524f73f, down while the upgraded leader compacts (every 100
    entries): back, it is sent the leader's dump, which it cannot load. After three
    sends not taken the leader says so, names it, and sends it the dump rewritten as
    524f73f writes it: that seed, still on 524f73f, loads it and serves every
    acknowledged message at its position; upgraded later, too. Before, it was sent the
    same dump 10-25 times a second, never ready, and the leader said nothing."""
    cluster = MixedCluster(tmp_path, old_tree, members=3, old={2},
                           ClusterLogCompactionEntries="100", ClusterLogCompactionTime="3600")
    cluster.start_all()
    try:
        cluster.wait_ready(timeout=40)
        cluster.kill(2, 15)
        leader = leader_of(cluster)
        acked: dict[str, list[tuple[bytes, Position]]] = {}
        for round_ in range(20):  # until the leader has compacted (its first dump)
            publish(cluster, 100, f"behind-{round_}-", acked)
            if (tmp_path / "data" / f"migratory-{leader}" / "raft.dump").exists():
                break
        else:
            raise AssertionError("the leader wrote no dump")
        cluster.start(2)  # on 524f73f
        raft_address = cluster.settings[2]["ClusterMemberListen"].rsplit(":", 1)
        seed = f"{raft_address[0]}:{int(raft_address[1]) + 1}"
        wait_for("the leader names the seed", lambda: any(
            UNTAKEN_LINE in line and seed in line
            for member in (0, 1) for line in cluster.log(member).splitlines()
        ), 30)
        cluster.wait_ready([2], timeout=30)  # on 524f73f, the dump rewritten for it
        assert "KeyError: 'cached'" in cluster.log(2)  # (the dump it could not load)
        publish(cluster, 50, "after-", acked)
        resumes_everything(cluster, 2, acked)
        for member in (0, 1):  # (seed 2 may lead by now: 524f73f has no such field)
            assert cluster.status(member)["raft_dumps_untaken"] == {}, member
        cluster.restart(2, old=False)  # upgraded: on the dump 524f73f wrote
        cluster.wait_ready([2], timeout=30)
        resumes_everything(cluster, 2, acked)
    finally:
        cluster.stop()


def test_takeover_notices_reach_524f73f_members_harmlessly(
    tmp_path: Path, old_tree: Path,
) -> None:
    """Seeds 0 and 1 of this version announce an MQTT client id's CONNECTs on
    ``/$mqtt-takeover/connect``; seed 2 and non-seed 3, of 524f73f, apply those notices
    as any committed message of a ``/$`` subject: no subscriber of theirs gets one (not
    ``#``, and that topic is refused), nothing logged. They announce nothing: a
    connection of theirs is not closed by a CONNECT elsewhere, nor does a CONNECT there
    close one elsewhere (docs/cluster.md says so); members of this version close
    theirs as before."""
    cluster = MixedCluster(tmp_path, old_tree, members=4, old={2, 3})
    cluster.start_all()
    clients: list[PahoClient] = []

    def connect(member: int, client_id: str) -> PahoClient:
        client = PahoClient(cluster.mqtt_port(member), client_id, clean_session=False)
        clients.append(client)
        return client

    try:
        cluster.wait_ready(timeout=40)
        watchers = {member: connect(member, f"watch-{member}") for member in range(4)}
        for watcher in watchers.values():
            assert watcher.subscribe("#", 1) == [1]
        assert connect(3, "spy").subscribe("$mqtt-takeover/connect", 1) == [0x80]
        first = connect(0, "device")
        old = connect(2, "device")  # 524f73f: announces nothing
        time.sleep(2)
        assert not first.disconnected.is_set()
        latest = connect(1, "device")  # closes this version's connection, not 524f73f's
        wait_for("member 0's connection taken over", first.disconnected.is_set, 10)
        connect(3, "device")
        time.sleep(2)
        assert not old.disconnected.is_set() and not latest.disconnected.is_set()
        publisher = connect(0, "publisher")
        publisher.publish("watched/topic", b"after the notices", qos=1)
        for member, watcher in watchers.items():
            got = watcher.receive(1, timeout=10)
            assert [(m.topic, m.payload) for m in got] == [("watched/topic",
                                                            b"after the notices")], member
            assert watcher.nothing_more(), member
    finally:
        for client in clients:
            client.stop()
        cluster.stop()
    for member in (2, 3):
        log = cluster.log(member)
        assert "Traceback" not in log and " ERROR " not in log, log[-3000:]
