"""A rolling upgrade from 524f73f: this code on the ClusterDataDir that version wrote.

``upgrade_fixture/seeds-524f73f.tar.gz`` holds the data dirs of 3 seeds of 524f73f
(a Raft journal, a dump of the format before cluster/dump_decoder.py, an MQTT device's
persistent session recorded before records named their writer), made by
``upgrade_fixture/make_fixture.py``; ``expected.json`` what those seeds acknowledged,
with positions. docs/cluster.md, "Upgrading", says what these pin.
"""

from __future__ import annotations

import gzip
import io
import json
import sys
import tarfile
from pathlib import Path

from cluster_fixture import LocalCluster
from cluster_load import LoadPublisher, LoadSubscriber
from test_raft_dump_protocol import follower_seed
from test_raft_follower import LEADER, dump_message

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "server"))
from paho_client import PahoClient

from cluster import raft_unpickler
from cluster.cache_sync import CacheSync
from migratory.model.message import MessageType
from migratory.model.position import Position
from migratory.protocol import ops

FIXTURE = Path(__file__).resolve().parent / "upgrade_fixture"


def old_cluster(tmp_path: Path) -> tuple[LocalCluster, dict[str, list[tuple[str, Position]]]]:
    """3 seeds of this code on 524f73f's data dirs (unpacked under ``tmp_path``), and
    what 524f73f acknowledged per subject, by position."""
    with tarfile.open(FIXTURE / "seeds-524f73f.tar.gz") as archive:
        archive.extractall(tmp_path / "data", filter="data")
    cluster = LocalCluster(tmp_path, members=3, seeds=3)
    for i, settings in enumerate(cluster.settings):
        settings["ListenMqtt"] = f"127.0.0.1:{cluster.port(i) + 5}"
    return cluster, acked_by_524f73f()


def acked_by_524f73f() -> dict[str, list[tuple[str, Position]]]:
    expected = json.loads((FIXTURE / "expected.json").read_text())
    return {
        subject: [(content, Position(epoch, seq)) for content, epoch, seq in messages]
        for subject, messages in expected["acked"].items()
    }


def test_seeds_of_524f73f_restarted_on_this_code_keep_every_acknowledged_message(
    tmp_path: Path,
) -> None:
    cluster, acked = old_cluster(tmp_path)
    subjects = sorted(acked)
    cluster.start_all()
    try:
        cluster.wait_ready(timeout=40)
        # every message 524f73f acknowledged, at its position: a resume from before the
        # first one is given them all, recovered (DATA_SYNC: the caches came back)
        start = {s: Position(messages[0][1].epoch, 0) for s, messages in acked.items()}
        subscriber = LoadSubscriber([cluster.port(2)], subjects=subjects, positions=start,
                                    duration=60, tag="resume")
        subscriber.start()
        try:
            subscriber.wait_for({c.encode() for m in acked.values() for c, _ in m}, 30)
            # new publishes go on after them, in the same lineage (no position reused)
            publisher = LoadPublisher([cluster.port(1)], rate=50, duration=30,
                                      subjects=subjects, tag="new-")
            publisher.start()
            try:
                publisher.wait_acked(10, 30)
            finally:
                publisher.stop()
            new = publisher.acked_messages()
            subscriber.wait_for({c for m in new.values() for c, _ in m}, 30)
        finally:
            subscriber.stop()
        got: dict[str, list[tuple[str, Position]]] = {s: [] for s in subjects}
        for message in subscriber.messages():
            got[message.subject].append((message.content.decode(), message.position))
        for subject in subjects:
            old = got[subject][:len(acked[subject])]
            assert old == acked[subject], f"{subject}: not what 524f73f acknowledged"
            after = got[subject][len(acked[subject]):]
            assert [(c.decode(), p) for c, p in new[subject]] == after
            last = acked[subject][-1][1]
            assert all(p.epoch == last.epoch and p.seq > last.seq for _, p in after), after
        recovered = {m.type for m in subscriber.messages()[:sum(map(len, acked.values()))]}
        assert recovered == {MessageType.RECOVERED}, recovered
        synced = {s.subject for s in subscriber.statuses(ops.Status.DATA_SYNC)}
        assert synced == set(subjects), subscriber.statuses()
        assert not subscriber.statuses(ops.Status.DATA_RESYNC)
    finally:
        cluster.stop()


def test_an_mqtt_session_524f73f_stored_resumes_on_this_code(tmp_path: Path) -> None:
    cluster, acked = old_cluster(tmp_path)
    expected = json.loads((FIXTURE / "expected.json").read_text())
    cluster.start_all()
    try:
        cluster.wait_ready(timeout=40)
        device = PahoClient(cluster.port(0) + 5, expected["device"], clean_session=False)
        assert device.session_present, "524f73f's persistent session was lost"
        try:
            publisher = PahoClient(cluster.port(2) + 5, "upgrade-publisher")
            publisher.publish("upgrade/a", b"after the upgrade", qos=1)
            publisher.stop()
            # its filter (upgrade/+) and its positions came back with it (no SUBSCRIBE
            # on this connection): what was published while it was away, then the new one
            missed = {subject: [c.encode() for c, _ in messages]
                      for subject, messages in acked.items()}
            count = sum(map(len, missed.values())) + 1
            received = device.receive(count, timeout=30)
            for subject, contents in missed.items():
                topic = subject.lstrip("/")
                assert [m.payload for m in received if m.topic == topic][:len(contents)] \
                    == contents, topic
            assert received[-1].payload == b"after the upgrade"
            assert device.nothing_more()
        finally:
            device.stop()
    finally:
        cluster.stop()


def test_a_follower_of_this_code_takes_the_dump_a_524f73f_leader_sends(tmp_path: Path) -> None:
    """The other way a seed meets 524f73f's dump in a rolling upgrade: sent by a leader
    of that version because it fell behind its compacted log (in process, no network)."""
    with tarfile.open(FIXTURE / "seeds-524f73f.tar.gz") as archive:
        member = archive.extractfile("migratory-1/raft.dump")
        assert member is not None
        dump = member.read()
    with gzip.GzipFile(fileobj=io.BytesIO(dump)) as g:
        _, last, _, _ = raft_unpickler.load(g)
    acked = acked_by_524f73f()
    restored: list[CacheSync] = []
    follower = follower_seed(tmp_path / "follower", restored)
    try:
        follower._SyncObj__onMessageReceived(LEADER, dump_message((dump, True, True), last[1]))
        assert follower._SyncObj__raftCommitIndex == last[1]  # loaded, and answered
        (sync,) = restored
        subjects = {s.subject: s for s in sync.subjects}
        (session,) = set(subjects) - set(acked)  # and the device's session record
        assert session.startswith("/$mqtt-session/") and subjects[session].snapshot
        for subject, messages in acked.items():
            held = subjects[subject]
            assert held.cached, subject
            want = [(c, p) for c, p in messages if p.seq <= held.seq]
            got = [(m.content.decode(), m.position) for m in held.cached]
            assert got == want[-len(got):]
            assert Position(held.epoch, held.seq) == want[-1][1]
    finally:
        follower.destroy()
