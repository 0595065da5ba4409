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


def test_the_seeds_own_publish_refused_by_its_stopped_raft_node_fails() -> None:
    stream, answers, origins = seed_with_a_publish()
    assert not raft_failed(stream, origins, CLOSED_NAME, unknown=False, reply_to=None, now=1.0)
    assert answers.reasons == ["not published: RAFT_STOPPED"]


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
