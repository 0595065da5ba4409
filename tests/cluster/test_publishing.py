"""cluster/publishing.py: ClusterPublishing, the publishes a member queues on their way
to Raft."""

from __future__ import annotations

from publish_answers import Answers

from cluster.coordination import UNNUMBERED_EPOCH
from cluster.publishing import ClusterPublishing
from cluster.replica import Replica
from migratory.model.message import Message
from migratory.protocol import ops
from migratory.server.hub import Hub


def test_the_queue_stays_bounded_while_nothing_takes_it() -> None:
    # a non-seed whose forward to its upstream seed is stuck (a link that neither
    # fails nor writes) for 100 s while clients publish 200 a second: every
    # publish is answered, and the queue never holds more than max_pending of them
    publishing = ClusterPublishing(
        origin="member#4", replica=Replica(Hub(epoch=UNNUMBERED_EPOCH)),
        publish_timeout=10.0, max_pending=200,
    )
    answers = Answers()
    most = 0
    for second in range(100):
        for n in range(200):
            publishing.submit(Message("/a/b", b"x" * 100, closure=str(n)), answers, second)
        publishing.expire(float(second))
        most = max(most, publishing.outgoing)
    assert most <= 200, f"{most} publishes queued"
    assert publishing.outgoing <= publishing.pending <= 200
    assert len(answers.results) == 100 * 200 - publishing.pending
    assert all(r.status is ops.Status.PUBLISH_FAILED for r in answers.results)
