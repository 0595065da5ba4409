"""Standard mode with real member processes: a persistent MQTT session (clean session 0,
QoS 1) that moves between live members -- away on A, back on B (which never held it),
back on A (which held its filters meanwhile, B's record newer), then, A killed
meanwhile, on C; and one taken up on B while A's newer record was still on its way.
docs/mqtt.md ("Resuming on *another* member"): the session is present (its record
forwarded), its filters are the newest record's, each subject it missed while away is
its snapshot (RETAIN) counted in ``mqtt_resyncs``, every message published after the
resume arrives, none twice on a connection; the later take-up stands."""

from __future__ import annotations

import queue
import sys
import time
from pathlib import Path

from cluster_fixture import LocalCluster
from test_cluster_mqtt_resume import mqtt_port
from test_cluster_standard import _forwarding, gated_pair
from test_cluster_standard_failover import standard_cluster, stats

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "server"))
from paho_client import PahoClient, Received
from rawclient import RawClient

from migratory.model.message import Message, Qos
from migratory.protocol import ops

STOCK, OTHER = "/Stocks/NYSE/IBM", "/Stocks/NYSE/T"
SCORE, BOND = "/Scores/NBA/LAL", "/Bonds/US/10Y"
PROBE = "/Probe/forwarded"
A, B, C = 0, 1, 2


class Members:
    """A native publisher on each member, and a native subscriber of PROBE on each: a
    probe published on one member and seen on another is behind everything that member
    forwarded before it (one link, in order) -- a session record saved before it too."""

    def __init__(self, cluster: LocalCluster, members: tuple[int, ...] = (A, B, C)) -> None:
        self.cluster = cluster
        self.publishers: dict[int, RawClient] = {}
        self.watchers: dict[int, RawClient] = {}
        for member in members:
            self.publishers[member] = RawClient(cluster.port(member))
            self.publishers[member].connect(f"pub-{member}")
            watcher = self.watchers[member] = RawClient(cluster.port(member))
            watcher.connect(f"probe-{member}")
            watcher.subscribe(PROBE)
            assert isinstance(watcher.recv_op(), ops.SubjectStatus)
        self.probes = 0

    def close(self) -> None:
        """Their connections closed (left open, a member's stop waits for their close
        answer: 5 s of CI time)."""
        for client in (*self.publishers.values(), *self.watchers.values()):
            client.close()

    def publish(self, member: int, subject: str, content: bytes) -> None:
        """A retained message (the subject's snapshot: a resync's RETAIN carries it), at
        QoS 1 (delivered at QoS 1, PUBACKed by the client)."""
        message = Message(subject, content, retained=True, qos=Qos.GUARANTEED,
                          closure=content.decode())
        status = self.publishers[member].publish(message)
        assert status.status is ops.Status.PUBLISH_OK

    def forwarded(self, source: int, targets: tuple[int, ...]) -> None:
        """Wait until ``targets`` have everything ``source`` forwarded so far."""
        self.probes += 1
        content = f"probe-{self.probes}".encode()
        self.publish(source, PROBE, content)
        for target in targets:
            deadline = time.monotonic() + 10
            while time.monotonic() < deadline:
                op = self.watchers[target].recv_op(timeout=10)
                if isinstance(op, ops.Deliver) and any(
                        m.content == content for m in op.messages):
                    break
            else:
                raise AssertionError(f"member {target} did not get {content!r}")


def until(device: PahoClient, last: bytes, wait: float = 10) -> list[Received]:
    """What ``device`` receives until ``last`` arrives not retained (or nothing for
    ``wait`` s)."""
    got: list[Received] = []
    for _ in range(50):
        try:
            (message,) = device.receive(1, timeout=wait)
        except queue.Empty:
            break
        got.append(message)
        if message.payload == last and not message.retain:
            break
    return got


def no_repeats(got: list[Received]) -> None:
    assert all(m.qos == 1 for m in got), got
    live = [(m.topic, m.payload) for m in got if not m.retain]
    assert len(live) == len(set(live)), f"delivered twice on one connection: {got}"


def back(cluster: LocalCluster, member: int, client_id: str = "mover") -> PahoClient:
    device = PahoClient(mqtt_port(cluster, member), client_id, clean_session=False)
    assert device.session_present, f"member {member}: the session is not there"
    return device


def test_a_session_moving_between_live_standard_members_keeps_its_filters_and_resyncs(
    tmp_path: Path,
) -> None:
    cluster = standard_cluster(tmp_path, mqtt=True)
    members = None
    try:
        members = Members(cluster)
        # on A: two filters, some messages
        device = PahoClient(mqtt_port(cluster, A), "mover", clean_session=False)
        assert not device.session_present
        assert device.subscribe("Stocks/NYSE/+", 1) == [1]
        assert device.subscribe("Bonds/#", 1) == [1]
        members.publish(A, OTHER, b"t1")  # had in full: no message of it missed
        for n in (1, 2):
            members.publish(A, STOCK, f"s{n}".encode())
        got = until(device, b"s2")
        assert [m.payload for m in got] == [b"t1", b"s1", b"s2"]
        device.stop()
        members.publish(A, STOCK, b"s3")  # missed while away
        members.forwarded(A, (B, C))

        # on B, which never held it: present, s3 as the snapshot (a counted resync); t1,
        # whose position is A's, too (its last message again: B cannot tell)
        resyncs = stats(cluster, B)["mqtt_resyncs"]
        device = back(cluster, B)
        got = until(device, b"", wait=1)
        assert sorted((m.payload, m.retain) for m in got) == [(b"s3", True), (b"t1", True)]
        assert stats(cluster, B)["mqtt_resyncs"] == resyncs + 2
        members.publish(A, STOCK, b"s4")  # after the resume: from A, and from B itself
        got += until(device, b"s4")  # (A's forward and B's own publish: no order between)
        members.publish(B, STOCK, b"s5")
        got += until(device, b"s5")
        assert [m.payload for m in got if m.topic == STOCK[1:]] == [b"s3", b"s4", b"s5"]
        no_repeats(got)
        # its filters change on B: Bonds/# gone, Scores/# added
        device.client.unsubscribe("Bonds/#")
        assert device.subscribe("Scores/#", 1) == [1]
        device.stop()
        members.publish(B, STOCK, b"s6")  # missed while away
        members.publish(B, SCORE, b"c1")  # of a filter only B's record has
        members.publish(B, BOND, b"b1")  # of the filter B's record no longer has
        members.forwarded(B, (A, C))

        # back on A, which held the old filters: B's newer record wins
        resyncs = stats(cluster, A)["mqtt_resyncs"]
        device = back(cluster, A)
        members.publish(A, BOND, b"b2")  # (before the others: it would come first)
        members.publish(A, STOCK, b"s7")
        members.publish(A, SCORE, b"c2")
        got = until(device, b"c2")
        assert (b"s6", True) in [(m.payload, m.retain) for m in got], got
        assert stats(cluster, A)["mqtt_resyncs"] >= resyncs + 1
        by_topic: dict[str, list[bytes]] = {}
        for m in got:
            by_topic.setdefault(m.topic, []).append(m.payload)
        assert by_topic.get("Scores/NBA/LAL") == [b"c1", b"c2"], got
        assert by_topic.get(STOCK[1:], [])[-1:] == [b"s7"], got
        assert "Bonds/US/10Y" not in by_topic, f"an unsubscribed filter came back: {got}"
        no_repeats(got)
        device.stop()
        # s7 (A's) everywhere before s8 (B's): members keep no common order of two
        # members' publishes of one subject (docs/cluster.md, "Standard mode"), and C,
        # given A's s7 after B's s8 (a busy box: the accounting CI of e554b77), held s7
        # as its snapshot, as Standard allows
        members.forwarded(A, (B, C))
        members.publish(B, STOCK, b"s8")
        members.forwarded(B, (C,))

        # A killed meanwhile: on C, which never held it either
        cluster.kill(A)
        resyncs = stats(cluster, C)["mqtt_resyncs"]
        device = back(cluster, C)
        got = until(device, b"s8", wait=1)
        assert (b"s8", True) in [(m.payload, m.retain) for m in got], got
        assert stats(cluster, C)["mqtt_resyncs"] >= resyncs + 1
        members.publish(C, BOND, b"b3")
        members.publish(C, STOCK, b"s9")
        got += until(device, b"s9")
        members.publish(B, SCORE, b"c3")
        got += until(device, b"c3")
        live = [m.payload for m in got if not m.retain]
        assert live[-2:] == [b"s9", b"c3"], got
        assert b"b3" not in live, got
        no_repeats(got)
        device.stop()
    finally:
        if members is not None:
            members.close()
        cluster.stop()


def test_a_session_taken_up_on_a_member_its_newer_record_has_not_reached_stays_the_clients(
    tmp_path: Path,
) -> None:
    """A's forwards to B wait (the link cut) while the client takes its session up twice
    more on A; it then connects on B, which resumes the older record it has and is told
    present 1, and subscribes ``Bonds/#`` there (SUBACK). The link back, A's record comes
    to B: before, generations were counts -- A's 3 outranked B's 2 on every member, B's
    connection was closed as taken over, and the next CONNECT found A's filters without
    ``Bonds/#`` (the SUBACK broken, the client told present 1: it would not subscribe
    again). The later take-up is the client's: B's. So is a session B started (present 0,
    A's record of the client id not there yet): A's older one does not replace it."""
    cluster, gate, _ = gated_pair(tmp_path, mqtt=True)
    members = None
    try:
        cluster.wait_ready()
        _forwarding(cluster, [A, B])
        members = Members(cluster, (A, B))
        device = PahoClient(mqtt_port(cluster, A), "racer", clean_session=False)
        assert device.subscribe("Stocks/#", 1) == [1]
        device.stop()
        members.forwarded(A, (B,))  # B holds the session's first record
        gate.close_gate(reset_open=True)
        deadline = time.monotonic() + 10
        while cluster.status(A)["forwarding_to"] and time.monotonic() < deadline:
            time.sleep(0.05)
        assert cluster.status(A)["forwarding_to"] == []
        for _ in range(2):  # A's records wait for the link to B
            device = back(cluster, A, "racer")
            device.stop()
        fresh = PahoClient(mqtt_port(cluster, A), "fresh", clean_session=False)
        assert fresh.subscribe("Stocks/#", 1) == [1]  # a session B has not heard of
        fresh.stop()
        back(cluster, A, "fresh").stop()
        fresh = PahoClient(mqtt_port(cluster, B), "fresh", clean_session=False)
        assert not fresh.session_present  # (told: it subscribes again)
        assert fresh.subscribe("Bonds/#", 1) == [1]
        fresh.stop()
        device = back(cluster, B, "racer")
        assert device.subscribe("Bonds/#", 1) == [1]
        gate.open_gate()
        _forwarding(cluster, [A])
        members.forwarded(A, (B,))  # A's records reached B
        members.forwarded(B, (A,))
        device.stop()  # (its last save: before, found taken over, not saved)
        for member in (B, A):
            device = back(cluster, member, "racer")
            members.publish(member, BOND, f"bond-{member}".encode())
            got = until(device, f"bond-{member}".encode())
            assert f"bond-{member}".encode() in [m.payload for m in got], (
                f"member {member}: the filter subscribed on B is gone: {got}")
        for member in (B, A):  # the session B started stands: Bonds/# alone
            fresh = back(cluster, member, "fresh")
            members.publish(member, STOCK, b"stock")
            members.publish(member, BOND, b"bond")
            got = until(fresh, b"bond")
            assert got and got[-1].payload == b"bond", (member, got)  # (bond-N: missed)
            assert STOCK[1:] not in {m.topic for m in got}, f"A's filters came back: {got}"
            fresh.stop()
        # its connection on A left open (half-open, say) while it takes the session up on
        # B: A's connection, outranked by B's record, closes itself at its next save
        members.forwarded(A, (B,))  # (B has the record A's connection took up)
        on_b = back(cluster, B, "racer")
        members.forwarded(B, (A,))
        members.publish(A, BOND, b"bond-last")
        assert b"bond-last" in [m.payload for m in until(device, b"bond-last")]
        assert b"bond-last" in [m.payload for m in until(on_b, b"bond-last")]
        assert device.disconnected.wait(5), "A's outranked connection stayed open"
        on_b.stop()
    finally:
        if members is not None:
            members.close()
        cluster.stop()
        gate.shutdown()
