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
    node.lineage.met(PEER, "life-2", node.hub.holdings_made)  # its link, after
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
    node.lineage.met(PEER, "life-2", node.hub.holdings_made)
    sink, _ = subscribed(node)
    node.take_forward(PEER, forward(1, "one", epoch=78), 1.0, incarnation="life-2")
    assert statuses(sink) == [] and contents(sink) == [b"one"]
    assert node.lineage.gaps == 0


class WildcardSink:
    """An MQTT session as the hub sees it (a MessageSink): what it was given and told."""

    def __init__(self) -> None:
        self.messages: list[bytes] = []
        self.resyncs: list[str] = []

    def deliver_message(self, message: Message, qos: int) -> None:
        self.messages.append(message.content)

    def resync(self, subject: str, position: Position, snapshot: Message | None,
               qos: int) -> None:
        self.resyncs.append(subject)


WILDCARD = ("chaos", "#")


def test_a_restarted_peers_seq_1_of_a_subject_only_a_wildcard_holds_is_announced() -> None:
    """The filter was held before this member met the peer's new life, the subject
    itself never was: the earlier life's lost first message was the filter's to get.
    Before: taken as the subject's first (nobody held it), the session never told."""
    node = member()
    session = WildcardSink()
    node.hub.listen_filter(session, WILDCARD, 0)  # type: ignore[arg-type]
    node.lineage.met(PEER, "life-2", node.hub.holdings_made)
    node.take_forward(PEER, forward(1, "two", epoch=78), 1.0, incarnation="life-2")
    assert session.resyncs == [SUBJECT] and session.messages == [b"two"]
    assert node.lineage.gaps == 1


def test_a_wildcard_first_held_after_the_peers_process_was_met_takes_seq_1_as_is() -> None:
    node = member()
    node.lineage.met(PEER, "life-2", node.hub.holdings_made)
    session = WildcardSink()
    node.hub.listen_filter(session, WILDCARD, 0)  # type: ignore[arg-type]
    node.take_forward(PEER, forward(1, "one", epoch=78), 1.0, incarnation="life-2")
    assert session.resyncs == [] and session.messages == [b"one"]
    assert node.lineage.gaps == 0


def test_a_subject_made_after_the_meeting_under_an_older_wildcard_is_announced() -> None:
    """The subject's state is newer than the meeting (a native subscriber came), the
    filter older: the filter's session may have missed an earlier life's message.
    Before: the subject's own age alone said it came after: no resync."""
    node = member()
    session = WildcardSink()
    node.hub.listen_filter(session, WILDCARD, 0)  # type: ignore[arg-type]
    node.lineage.met(PEER, "life-2", node.hub.holdings_made)
    sink, _ = subscribed(node)
    node.take_forward(PEER, forward(1, "two", epoch=78), 1.0, incarnation="life-2")
    assert session.resyncs == [SUBJECT]
    assert [s for s, _ in statuses(sink)] == [ops.Status.DATA_RESYNC]


def test_a_filter_handed_to_another_sink_keeps_its_age() -> None:
    """An MQTT resume's catch-up hands the session its filters back (the session's
    added, then the resume's removed): the filter was held all along."""
    node = member()
    resume, session = WildcardSink(), WildcardSink()
    node.hub.listen_filter(resume, WILDCARD, 0)  # type: ignore[arg-type]
    node.lineage.met(PEER, "life-2", node.hub.holdings_made)
    node.hub.listen_filter(session, WILDCARD, 0)  # type: ignore[arg-type]
    node.hub.unlisten_filter(resume, WILDCARD)  # type: ignore[arg-type]
    node.take_forward(PEER, forward(1, "two", epoch=78), 1.0, incarnation="life-2")
    assert session.resyncs == [SUBJECT]
    node.hub.unlisten_filter(session, WILDCARD)  # type: ignore[arg-type]
    assert node.hub.made("/chaos/s1") is None  # released: no filter holds it any more


def test_a_gap_on_a_forgotten_subject_a_wildcard_matches_is_announced() -> None:
    """The subject was held (a forward came), then forgotten (spent: nothing cached, no
    snapshot, no exact subscriber); the peer's next forward skips one. Before: a gap on
    a subject not held was told to no one, the wildcard's session included."""
    node = member()
    node.lineage.met(PEER, "life-1", node.hub.holdings_made)
    session = WildcardSink()
    node.hub.listen_filter(session, WILDCARD, 0)  # type: ignore[arg-type]
    node.take_forward(PEER, forward(1, "one"), 1.0, incarnation="life-1")
    assert session.resyncs == [] and node.lineage.gaps == 0
    node.hub.expire(10_000.0)  # cached messages expired: the subject forgotten
    assert node.hub.position(SUBJECT) is None
    node.take_forward(PEER, forward(3, "three"), 10_001.0, incarnation="life-1")  # no 2
    assert session.resyncs == [SUBJECT] and session.messages == [b"one", b"three"]
