"""What a seed tells publishers when Raft does not commit their batch."""

from __future__ import annotations

import pytest
import trio
from publish_answers import Answers

from cluster import link
from cluster.coordination import UNNUMBERED_EPOCH, Coordinator, PublishRequest
from cluster.publishing import ClusterPublishing
from cluster.raft_outcomes import CLOSED_NAME, barrier_committed, raft_failed
from cluster.replica import Replica
from cluster.stream import Backlog, CommittedStream, Outbound, wire_bytes
from migratory.model.message import Message
from migratory.protocol import ops
from migratory.server.hub import Hub

IBM = "/Stocks/NYSE/IBM"


def seed_with_a_publish() -> tuple[CommittedStream, Answers, list[tuple[str, int]]]:
    replica = Replica(Hub(epoch=UNNUMBERED_EPOCH))
    stream = CommittedStream(ClusterPublishing(origin="seed#1", replica=replica))
    answers = Answers()
    stream.publishing.submit(Message(IBM, b"x"), answers, 0.0)
    (request,) = stream.publishing.take_outgoing()
    return stream, answers, [(request.origin, request.ref)]


def test_a_definite_refusal_fails_the_publish_at_once() -> None:
    stream, answers, origins = seed_with_a_publish()
    assert not raft_failed(stream, origins, "QUEUE_FULL", unknown=False, reply_to=None, now=1.0)
    assert answers.reasons == ["not published: QUEUE_FULL"]


def test_a_definite_refusal_of_a_forward_goes_back_to_the_non_seed() -> None:
    stream, _, _ = seed_with_a_publish()
    send, receive = trio.open_memory_channel[Outbound](10)
    stream.follow("edge", 0, False, send)
    receive.receive_nowait()  # the heartbeat after the catch-up
    origins = [("edge#1", 7)]
    raft_failed(stream, origins, "MISSING_LEADER", unknown=False, reply_to="edge", now=1.0)
    op = link.decode_op(wire_bytes(receive.receive_nowait())[4:])
    assert op == link.ForwardFailed((("edge#1", 7),), "MISSING_LEADER", False)


def test_a_forward_refused_by_a_stopped_raft_node_ends_the_link_unanswered() -> None:
    """Never submitted (the seed's Raft node stopped: its disk): the non-seed forwards it
    again through another seed once its link ends. Before, it was told ``ForwardFailed``
    and its publisher got ``PUBLISH_FAILED`` (test_cluster_upstream_full_disk.py)."""
    stream, _, _ = seed_with_a_publish()
    send, receive = trio.open_memory_channel[Outbound](10)
    ended: list[bool] = []
    stream.follow("edge", 0, False, send, Backlog(on_drop=lambda: ended.append(True)))
    receive.receive_nowait()  # the heartbeat after the catch-up
    assert not raft_failed(stream, [("edge#1", 7)], CLOSED_NAME, unknown=False,
                           reply_to="edge", now=1.0)
    assert ended == [True] and "edge" not in stream.followers
    with pytest.raises(trio.EndOfChannel):
        receive.receive_nowait()  # no ForwardFailed: closed, nothing more


def test_the_seeds_own_publish_refused_by_its_stopped_raft_node_goes_through_another() -> None:
    """Never submitted: the seed, leaving, forwards it through another seed
    (``GuaranteedNode._leave_after_raft_stopped``), first. Before, its publisher got
    ``PUBLISH_FAILED`` "RAFT_STOPPED" while the other seeds were fine (350 and 496 in two
    runs at 2,000/s: docs/cluster.md)."""
    stream, answers, origins = seed_with_a_publish()
    assert not raft_failed(stream, origins, CLOSED_NAME, unknown=False, reply_to=None, now=1.0)
    assert answers.results == []
    assert stream.publishing.resend_unanswered(now=1.0) == 1
    (again,) = stream.publishing.take_outgoing()
    assert (again.origin, again.ref) == origins[0]


def test_an_unknown_outcome_waits_for_a_barrier() -> None:
    stream, answers, origins = seed_with_a_publish()
    assert raft_failed(stream, origins, "LEADER_CHANGED", unknown=True, reply_to=None, now=1.0)
    assert answers.results == []
    barrier_committed(stream, origins, "LEADER_CHANGED", reply_to=None, now=2.0)
    assert answers.reasons == ["not published: the Raft leader changed (LEADER_CHANGED)"]


def test_a_barrier_says_nothing_while_the_seed_has_a_gap() -> None:
    """Found by the cluster model: batches before the barrier that this seed could not
    apply never reached its followers, so one of them may hold a committed publish."""
    stream, answers, origins = seed_with_a_publish()
    raft_failed(stream, origins, "NOT_LEADER", unknown=True, reply_to=None, now=1.0)
    coordinator = Coordinator()
    other = PublishRequest("edge#1", 1, Message(IBM, b"y"))
    coordinator.apply_batch(700, [other])
    stream.on_committed(coordinator.apply_batch(700, []), 1.5)  # batch 2 first: a gap
    assert stream.replica.needs_sync
    barrier_committed(stream, origins, "NOT_LEADER", reply_to=None, now=2.0)
    assert answers.results == []
    stream.publishing.expire(60.0)
    (reason,) = answers.reasons
    assert reason is not None and reason.startswith("outcome unknown")


def test_a_forward_committed_before_its_barrier_is_acknowledged_not_failed() -> None:
    """A leader that stopped (its disk) had sent a non-seed's forward to the followers;
    the seed that took it heard "the Raft leader changed" (unknown), and the next leader
    commits it before the seed's barrier. The non-seed gets the batch first, on the same
    link: its publisher gets PUBLISH_OK, and the barrier's failure after it says nothing
    (test_raft_stopped_links.py builds the Raft side with real nodes)."""
    edge = ClusterPublishing(origin="edge#1", replica=Replica(Hub(epoch=UNNUMBERED_EPOCH)))
    answers = Answers()
    edge.submit(Message(IBM, b"x"), answers, 0.0)
    (request,) = edge.take_outgoing()
    seed, _, _ = seed_with_a_publish()
    send, receive = trio.open_memory_channel[Outbound](10)
    seed.follow("edge", 0, False, send)
    receive.receive_nowait()  # the heartbeat after the catch-up
    origins = [(request.origin, request.ref)]
    assert raft_failed(seed, origins, "LEADER_CHANGED", unknown=True, reply_to="edge", now=1.0)
    seed.on_committed(Coordinator().apply_batch(700, [request]), 1.5)  # the next leader's
    barrier_committed(seed, origins, "LEADER_CHANGED", reply_to="edge", now=2.0)
    frames = [link.decode_op(wire_bytes(receive.receive_nowait())[4:]) for _ in range(2)]
    assert [type(op) for op in frames] == [link.Batch, link.ForwardFailed]
    for op in frames:  # as the non-seed's upstream link takes them (cluster/upstream.py)
        if isinstance(op, link.Batch):
            edge.on_committed(op.batch, 2.5)
        elif isinstance(op, link.ForwardFailed):
            edge.on_failed(list(op.origins), op.reason, unknown=op.unknown, now=2.5)
    assert [r.status for r in answers.results] == [ops.Status.PUBLISH_OK]
