"""cluster/publishing.py: ClusterPublishing, the publishes a member queues on their way
to Raft."""

from __future__ import annotations

from publish_answers import Answers

from cluster import link
from cluster.coordination import UNNUMBERED_EPOCH, CommittedBatch, Coordinator, PublishRequest
from cluster.forwarding import Outgoing
from cluster.publishing import OVERTAKEN, ClusterPublishing
from cluster.replica import Replica
from cluster.stream import CommittedStream
from cluster.upstream import UpstreamReplication
from migratory.model.message import Message
from migratory.model.position import Position
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


# --- a non-seed that switched seeds: its unanswered publishes forwarded again ---------


def _member(timeout: float = 10.0) -> tuple[ClusterPublishing, Answers]:
    publishing = ClusterPublishing(
        origin="edge#1", replica=Replica(Hub(epoch=UNNUMBERED_EPOCH)), publish_timeout=timeout
    )
    return publishing, Answers()


def _publish(publishing: ClusterPublishing, answers: Answers, names: str, now: float) -> None:
    for name in names:
        publishing.submit(Message("/a/b", name.encode(), closure=name), answers, now)


def test_unanswered_forwards_go_again_oldest_first_ahead_of_the_newer() -> None:
    publishing, answers = _member()
    _publish(publishing, answers, "abcd", 0.0)
    assert [r.ref for r in publishing.take_outgoing()] == [1, 2, 3, 4]
    _publish(publishing, answers, "ef", 1.0)  # never taken: still queued
    coordinator = Coordinator()
    first = coordinator.apply_batch(7, [PublishRequest("edge#1", 1, Message("/a/b", b"a"))])
    publishing.on_committed(first, 1.0)  # a: answered
    publishing.on_failed([("edge#1", 2)], "REQUEST_DENIED", unknown=False, now=1.0)  # b: failed
    assert publishing.resend_unanswered(2.0) == 2
    assert [r.ref for r in publishing.take_outgoing()] == [3, 4, 5, 6]
    assert publishing.statistics()["resent"] == 2
    # switched again: 3..6 were all taken now; none of what was answered goes again
    assert publishing.resend_unanswered(2.5) == 4
    assert [r.ref for r in publishing.take_outgoing()] == [3, 4, 5, 6]
    assert [(r.closure, r.status.name) for r in answers.results] == [
        ("a", "PUBLISH_OK"), ("b", "PUBLISH_FAILED")]


def test_links_that_end_before_forwarding_queue_no_second_copy() -> None:
    publishing, answers = _member()
    _publish(publishing, answers, "abc", 0.0)
    publishing.take_outgoing()
    _publish(publishing, answers, "d", 0.5)
    assert publishing.resend_unanswered(1.0) == 3
    assert publishing.resend_unanswered(1.1) == 0  # nothing taken meanwhile
    assert [r.ref for r in publishing.take_outgoing()] == [1, 2, 3, 4]


def test_only_what_is_younger_than_half_the_timeout_goes_again() -> None:
    """A seed may hold a forward up to half the publish timeout before Raft has it
    (raft_forward.hold_deadline): an older one could commit after its client was told
    the outcome is unknown."""
    publishing, answers = _member(timeout=10.0)
    _publish(publishing, answers, "a", 0.0)
    _publish(publishing, answers, "b", 4.0)
    publishing.take_outgoing()
    assert publishing.resend_unanswered(5.5) == 1
    assert [r.message.content for r in publishing.take_outgoing()] == [b"b"]
    assert publishing.expire(10.5) == 1  # a: outcome unknown, never sent again
    assert publishing.resend_unanswered(10.5) == 0


def test_a_copy_answered_in_a_batch_gets_the_first_position_once() -> None:
    publishing, answers = _member()
    _publish(publishing, answers, "ab", 0.0)
    requests = publishing.take_outgoing()
    coordinator = Coordinator()
    coordinator.apply_batch(7, requests)  # committed; this member never saw that batch
    publishing.resend_unanswered(1.0)
    again = coordinator.apply_batch(7, publishing.take_outgoing())
    assert again.messages == () and len(again.repeats) == 2
    publishing.on_committed(again, 1.5)
    publishing.on_committed(again, 1.6)  # a second copy's answer: nothing more
    assert [(r.closure, r.status.name, r.position) for r in answers.results] == [
        ("a", "PUBLISH_OK", Position(7, 1)), ("b", "PUBLISH_OK", Position(7, 2))]
    assert publishing.statistics()["acknowledged_repeats"] == 2
    other = CommittedBatch(3, (), (), (("edge#2", 9, 7, 3),))  # another member's
    assert publishing.on_committed(other, 2.0) is not None and len(answers.results) == 2


def test_a_batch_answers_a_members_publishes_in_the_order_they_were_submitted() -> None:
    """A batch with copies of publishes numbered before (answered from ``repeats``) and
    newer ones numbered in it: each client gets its answers in the order it published
    (MQTT 3.1.1 section 4.6: PUBACKs in the order of the PUBLISH packets). Before, the
    newer ones were answered first: c, then a and b."""
    publishing, answers = _member()
    _publish(publishing, answers, "ab", 0.0)
    coordinator = Coordinator()
    coordinator.apply_batch(7, publishing.take_outgoing())  # committed; not seen here
    _publish(publishing, answers, "c", 0.5)
    publishing.resend_unanswered(1.0)  # a and b again, ahead of c
    batch = coordinator.apply_batch(7, publishing.take_outgoing())
    assert [ref for _, ref in batch.origins] == [3] and len(batch.repeats) == 2
    publishing.on_committed(batch, 1.5)
    assert [(r.closure, r.position) for r in answers.results] == [
        ("a", Position(7, 1)), ("b", Position(7, 2)), ("c", Position(7, 3))]


def test_a_publish_forwarded_twice_believes_no_definite_failure() -> None:
    """The seed it left may still commit the first copy: only a commit or the timeout
    answers it."""
    publishing, answers = _member()
    _publish(publishing, answers, "ab", 0.0)
    publishing.take_outgoing()
    publishing.on_failed([("edge#1", 1)], "REQUEST_DENIED", unknown=False, now=0.5)
    assert publishing.resend_unanswered(1.0) == 1  # b only: a was told it failed
    publishing.take_outgoing()
    publishing.on_failed([("edge#1", 2)], "REQUEST_DENIED", unknown=False, now=1.5)
    assert answers.reasons == ["not published: REQUEST_DENIED"]
    assert publishing.expire(11.0) == 1
    assert answers.reasons[1] == "outcome unknown: no commit seen within 10 s"


def test_copies_a_seed_refused_are_counted_after_the_first_copies_answered() -> None:
    """The copies' command failed for sure at the next seed (a Raft leader change, the
    barrier after it committed) after the first copies' batch had answered the publishes:
    nothing more is answered, and the refused copies are counted -- they never reached the
    coordinator, so none of them can come back as a repeat (the CI of 0dfa9a5f: 2,019
    sent again, 0 repeats, 40 newer publishes failed "the Raft leader changed")."""
    publishing, answers = _member()
    _publish(publishing, answers, "abc", 0.0)
    coordinator = Coordinator()
    first = coordinator.apply_batch(7, publishing.take_outgoing())  # not seen here yet
    assert publishing.resend_unanswered(1.0) == 3
    publishing.take_outgoing()
    publishing.on_committed(first, 1.2)  # the next seed caught this member up
    copies = [("edge#1", 1), ("edge#1", 2), ("edge#1", 3)]
    publishing.on_failed(copies[:1], "LEADER_CHANGED", unknown=True, now=1.3)  # may commit
    publishing.on_failed(copies, "the Raft leader changed", unknown=False, now=1.5)
    publishing.on_failed(copies, "the Raft leader changed", unknown=False, now=1.6)  # again
    assert [(r.closure, r.status.name) for r in answers.results] == [
        ("a", "PUBLISH_OK"), ("b", "PUBLISH_OK"), ("c", "PUBLISH_OK")]
    stats = publishing.statistics()
    assert (stats["resent"], stats["repeats"], stats["copies_refused"]) == (3, 0, 3)


def test_a_publish_the_coordinator_found_overtaken_fails_at_once() -> None:
    """Its first copy was lost (a Raft leader change), a newer publish of this member was
    numbered, and its copy, sent again through another seed, was dropped: the batch says
    so (``overtaken``), and the publish fails for sure at once -- resent, after a sync --
    where it timed out "outcome unknown" before."""
    publishing, answers = _member()
    coordinator = Coordinator()
    _publish(publishing, answers, "z", 0.0)
    publishing.on_committed(coordinator.apply_batch(7, publishing.take_outgoing()), 0.1)
    _publish(publishing, answers, "abc", 0.2)
    first = publishing.take_outgoing()
    numbered = coordinator.apply_batch(7, first[2:])  # a and b lost on the way
    publishing.on_jump(0.5)  # (a sync replaced that batch here)
    assert publishing.resend_unanswered(1.0) == 3
    again = coordinator.apply_batch(7, publishing.take_outgoing())
    assert again.repeats == (("edge#1", 4, 7, 2),)
    assert again.overtaken == (("edge#1", 2), ("edge#1", 3))
    publishing.on_committed(again, 1.5)
    publishing.on_committed(numbered, 1.6)  # (after the sync: nothing more)
    assert [(r.closure, r.status.name, r.reason) for r in answers.results] == [  # in order
        ("z", "PUBLISH_OK", None), ("a", "PUBLISH_FAILED", OVERTAKEN),
        ("b", "PUBLISH_FAILED", OVERTAKEN), ("c", "PUBLISH_OK", None)]
    stats = publishing.statistics()
    assert (stats["overtaken"], stats["failed"], stats["pending"]) == (2, 2, 0)
    other = CommittedBatch(8, (), (), (), (("edge#2", 9),))  # another member's
    publishing.on_committed(other, 2.0)
    assert len(answers.results) == 4


def test_a_copy_is_forgotten_once_no_seed_answers_it() -> None:
    publishing, answers = _member()
    _publish(publishing, answers, "ab", 0.0)
    publishing.take_outgoing()
    publishing.resend_unanswered(1.0)
    publishing.take_outgoing()
    publishing.expire(10.5)  # both answered: outcome unknown
    publishing.expire(11.5)  # the copies, resent at 1.0, forgotten too
    publishing.on_failed([("edge#1", 1)], "REQUEST_DENIED", unknown=False, now=11.6)
    assert publishing.statistics()["copies_refused"] == 0
    assert len(answers.results) == 2


def test_a_forwarded_publish_refused_for_its_size_is_answered_so() -> None:
    """The seed's answer names the status the publisher gets (was: PUBLISH_FAILED for
    every ForwardFailed, a message over the seed's MaxMessageSize too): each frame as
    the non-seed decodes it and its upstream hands it to the publishing."""
    publishing, answers = _member()
    stream = CommittedStream(publishing)
    upstream = UpstreamReplication(name="10.0.0.2:1", seeds=[("10.0.0.1", 1)], password="p",
                                   stream=stream, outgoing=Outgoing(publishing),
                                   max_frame=link.MAX_FRAME)
    _publish(publishing, answers, "abc", 0.0)
    publishing.take_outgoing()
    for failed in [
        link.ForwardFailed((("edge#1", 1),), "MESSAGE_SIZE_LIMIT_EXCEEDED: too large", False,
                           ops.Status.MESSAGE_SIZE_LIMIT_EXCEEDED),
        link.ForwardFailed((("edge#1", 2),), "PUBLISH_DENIED: /$x", False,
                           ops.Status.PUBLISH_DENIED),
        link.ForwardFailed((("edge#1", 3),), "MISSING_LEADER", False),
    ]:
        upstream._on_op("10.0.0.1:1", link.decode_op(link.encode_frame(failed)[4:]), 1.0)
    assert [(r.closure, r.status.name) for r in answers.results] == [
        ("a", "MESSAGE_SIZE_LIMIT_EXCEEDED"), ("b", "PUBLISH_DENIED"), ("c", "PUBLISH_FAILED")]
    assert answers.results[0].reason == "not published: MESSAGE_SIZE_LIMIT_EXCEEDED: too large"


def test_what_was_taken_up_to_a_ref_waits_until_each_has_its_outcome() -> None:
    """What a seed whose Raft node stopped waits for before its drain (cluster/node.py)."""
    publishing, answers = _member()
    assert publishing.last_ref == 0 and not publishing.waiting_up_to(0)
    _publish(publishing, answers, "ab", now=0.0)
    taken = publishing.last_ref
    _publish(publishing, answers, "c", now=0.1)  # after: not waited for
    (first, second, third) = publishing.take_outgoing()
    publishing.on_committed(Coordinator().apply_batch(700, [second, third]), 0.2)
    assert publishing.waiting_up_to(taken)  # the oldest still waits
    publishing.on_failed([(first.origin, first.ref)], "QUEUE_FULL", unknown=False, now=0.3)
    assert not publishing.waiting_up_to(taken)
