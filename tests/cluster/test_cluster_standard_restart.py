"""Standard mode with real member processes, a member that dies with a forward not sent:
its next life numbers its forwards of each subject from seq 1 again, in new epochs, so
seq 1 alone cannot tell a peer that nothing came before. A subscriber on the peer must
get the missed message or DATA_RESYNC, never the next one as if nothing were missing
(``ForwardLineage.met``: a subject held here before this member met the sender's
process may have missed a forward of an earlier life)."""

from __future__ import annotations

import sys
import time
from pathlib import Path

from cluster_fixture import LocalCluster
from tcp_gate import TcpGate
from test_cluster_standard import _forwarding, _unannounced, gated_pair, receive_until

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "server"))
from rawclient import RawClient, delivered

from migratory.model.message import Message, MessageType
from migratory.protocol import ops

SUBJECT, OTHER, LATER = "/Stocks/NYSE/IBM", "/Stocks/NYSE/T", "/Stocks/NYSE/GE"


def _publish(client: RawClient, subject: str, content: bytes) -> None:
    status = client.publish(Message(subject, content, {content.decode(): "1"},
                                    retained=True, closure=content.decode()))
    assert status.status is ops.Status.PUBLISH_OK


def _resyncs(received: list[ops.ServerOp]) -> int:
    return sum(isinstance(op, ops.SubjectStatus) and op.status is ops.Status.DATA_RESYNC
               for op in received)


def killed_and_back(cluster: LocalCluster, gates: list[TcpGate]) -> RawClient:
    """Member 0 (with a forward waiting for its peer) SIGKILLed, the ``gates`` opened,
    member 0 started again: a publisher connected to its new life."""
    cluster.kill(0)
    for gate in gates:
        gate.open_gate()
    cluster.start(0)
    cluster.wait_ready([0])
    _forwarding(cluster, [0, 1])
    publisher = RawClient(cluster.port(0))
    publisher.connect("pub-again")
    return publisher


def announced_m2(on_b: RawClient, publisher: RawClient) -> None:
    """m2 published: B's subscriber gets it after exactly one DATA_RESYNC (m1's loss)."""
    _publish(publisher, SUBJECT, b"m2")
    received = receive_until(on_b, b"m2")
    assert delivered(received)[-1].content == b"m2", received
    assert _unannounced(received, [b"m1", b"m2"]) == [], received
    assert _resyncs(received) == 1


def test_a_forward_lost_with_a_killed_member_is_announced_after_its_restart(
    tmp_path: Path,
) -> None:
    """A forwards to B (B has met A's process, and heard of another subject from it);
    A's link to B is cut, A acknowledges SUBJECT's first message to its publisher (the
    forward waits in A's queue), A is SIGKILLed, restarted, and forwards SUBJECT's next
    message as (a new epoch, seq 1). Before: B's subscriber got it as if nothing were
    missing -- the first message lost, no DATA_RESYNC. A subject first held on B after
    it met A's new life is not resynced (its subscribers came after any earlier life)."""
    cluster, gate, _ = gated_pair(tmp_path)
    try:
        cluster.wait_ready()
        _forwarding(cluster, [0, 1])
        on_b = RawClient(cluster.port(1))
        on_b.connect("sub-b")
        for subject in (SUBJECT, OTHER):
            on_b.subscribe(subject)
            assert isinstance(on_b.recv_op(), ops.SubjectStatus)
        publisher = RawClient(cluster.port(0))
        publisher.connect("pub")
        _publish(publisher, OTHER, b"other")
        assert delivered(receive_until(on_b, b"other"))[-1].content == b"other"
        gate.close_gate(reset_open=True)  # A's link to B reset, and refused from now on
        deadline = time.monotonic() + 10
        while cluster.status(0)["forwarding_to"] and time.monotonic() < deadline:
            time.sleep(0.05)
        assert cluster.status(0)["forwarding_to"] == []
        _publish(publisher, SUBJECT, b"m1")  # acknowledged; its forward waits in A's queue
        publisher = killed_and_back(cluster, [gate])
        announced_m2(on_b, publisher)
        on_b.subscribe(LATER)  # first held on B after it met A's new life
        assert isinstance(on_b.recv_op(), ops.SubjectStatus)
        _publish(publisher, LATER, b"later")
        later = receive_until(on_b, b"later")
        assert _resyncs(later) == 0, later
        assert [m.type for m in delivered(later)] == [MessageType.UPDATE]
        assert cluster.status(1)["forward_gaps"] == 1
    finally:
        cluster.stop()
        gate.shutdown()
