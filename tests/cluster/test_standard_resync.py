"""A Standard member taking its peers' forwards (``StandardNode.take_forward``): a gap in
a peer's forwards of a subject is announced to the subject's subscribers, never silent --
also when this member has numbered nothing of the subject yet."""

from __future__ import annotations

from cluster.standard import StandardNode
from migratory.config import Config
from migratory.model.message import Message
from migratory.model.position import Position
from migratory.protocol import ops
from migratory.protocol.websocket import FrameDecoder

SUBJECT = "/chaos/s0"
PEER = "127.0.0.1:9011"


class RecordingSink:
    def __init__(self) -> None:
        self.frames: list[bytes] = []

    def deliver(self, frame: bytes) -> None:
        self.frames.append(frame)

    def ops(self) -> list[ops.ServerOp]:
        decoder = FrameDecoder(client_frames=False)
        return [ops.decode_server_op(e.data)  # type: ignore[union-attr]
                for e in decoder.events(b"".join(self.frames))]


def member() -> StandardNode:
    return StandardNode(Config.from_mapping({
        "Listen": "127.0.0.1:0",
        "ClusterMembers": f"127.0.0.1:9001, {PEER}",
        "ClusterMemberListen": "127.0.0.1:9001",
        "ClusterDeliveryMode": "Standard",
        "ClusterPassword": "a-cluster-password",
    }, source="test"))


def forward(seq: int, content: str, epoch: int = 77) -> Message:
    return Message(SUBJECT, content.encode(), epoch=epoch, seq=seq)


def subscribed(node: StandardNode) -> tuple[RecordingSink, list[ops.ServerOp]]:
    sink = RecordingSink()
    first = node.hub.subscribe(sink, ops.SubscriptionRequest(SUBJECT), 0.0)  # type: ignore[arg-type]
    return sink, first


def statuses(sink: RecordingSink) -> list[tuple[ops.Status, Position | None]]:
    return [(op.status, op.position) for op in sink.ops() if isinstance(op, ops.SubjectStatus)]


def contents(sink: RecordingSink) -> list[bytes]:
    return [m.content for op in sink.ops() if isinstance(op, ops.Deliver) for m in op.messages]


def test_a_gap_in_a_peers_forwards_is_announced_then_the_message_delivered() -> None:
    node = member()
    node.take_forward(PEER, forward(1, "one"), 1.0)
    sink, _ = subscribed(node)
    node.take_forward(PEER, forward(3, "three"), 2.0)  # its seq 2 never came
    assert [s for s, _ in statuses(sink)] == [ops.Status.DATA_RESYNC]
    assert contents(sink)[-1] == b"three"
    node.take_forward(PEER, forward(3, "three"), 3.0)  # a repair of what came: dropped
    assert contents(sink).count(b"three") == 1


def test_a_gap_before_anything_was_numbered_here_is_announced_too() -> None:
    """The subscriber subscribed before the subject's first message here, the peer's
    first forward was lost: it misses that message, and must be told (before, the
    member resynced only a subject it had numbered: the subscriber got the second
    message as the subject's first, at seq 1, and no DATA_RESYNC -- a silent gap)."""
    node = member()
    sink, first = subscribed(node)
    allow = [op for op in first if isinstance(op, ops.SubjectStatus)]
    assert allow and allow[0].position is not None and allow[0].position.seq == 0
    node.take_forward(PEER, forward(2, "two"), 1.0)  # its seq 1 never came
    assert [s for s, _ in statuses(sink)] == [ops.Status.DATA_RESYNC]
    assert contents(sink) == [b"two"]


def test_a_first_forward_to_a_subject_nobody_holds_is_no_resync() -> None:
    node = member()
    node.take_forward(PEER, forward(5, "five"), 1.0)  # the peer numbered it before we met
    sink, _ = subscribed(node)
    assert statuses(sink) == [] and node.hub.position(SUBJECT) is not None


def test_a_restarted_peers_seq_1_of_a_subject_held_here_is_announced() -> None:
    """The peer's earlier life acknowledged the subject's first message and died before
    forwarding it; its new life forwards the next one at (a new epoch, seq 1). Before:
    taken as the subject's first, the subscriber got it with no DATA_RESYNC."""
    node = member()
    sink, _ = subscribed(node)
    node.lineage.met(PEER, "life-2", node.hub.subjects_created)  # its link, after
    node.take_forward(PEER, forward(1, "two", epoch=78), 1.0, incarnation="life-2")
    assert [s for s, _ in statuses(sink)] == [ops.Status.DATA_RESYNC]
    assert contents(sink) == [b"two"]


def test_a_seq_1_from_a_process_never_met_of_a_subject_held_here_is_announced() -> None:
    """Nothing says no earlier life of the peer left a message out (a member that
    predates link settings sends no incarnation). Before: no DATA_RESYNC."""
    node = member()
    sink, _ = subscribed(node)
    node.take_forward(PEER, forward(1, "two", epoch=78), 1.0)
    assert [s for s, _ in statuses(sink)] == [ops.Status.DATA_RESYNC]
    assert contents(sink) == [b"two"]


def test_a_subject_first_held_after_the_peers_process_was_met_takes_its_seq_1_as_is() -> None:
    node = member()
    node.lineage.met(PEER, "life-2", node.hub.subjects_created)
    sink, _ = subscribed(node)
    node.take_forward(PEER, forward(1, "one", epoch=78), 1.0, incarnation="life-2")
    assert statuses(sink) == [] and contents(sink) == [b"one"]
    assert node.lineage.gaps == 0
