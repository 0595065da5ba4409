"""The cluster invariants are shown to fail on hand-made histories (planted bugs in the
machine: ``test_cluster_planted``)."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import pytest
from cluster_checker import (
    CommittedLog,
    SubscriberView,
    check_member,
    check_publish_answers,
    check_subscriber,
)
from cluster_link_contract import LinkContract, check_sync_answer

from cluster import link
from cluster.cache_sync import CacheSync
from cluster.coordination import UNNUMBERED_EPOCH, CommittedBatch, Coordinator, PublishRequest
from cluster.replica import Replica
from migratory.model.message import Message
from migratory.model.position import Position
from migratory.protocol import ops
from migratory.server.hub import Hub
from migratory_client.resume import SubjectTracker

IBM = "/Stocks/NYSE/IBM"


# --- hand-made histories -----------------------------------------------------------------


def committed_log(count: int) -> CommittedLog:
    coordinator, log = Coordinator(), CommittedLog()
    for i in range(count):
        message = Message(IBM, f"anon#{i}".encode(), retained=True)
        log.append(coordinator.apply_batch(700, [PublishRequest("a", i, message)]))
    return log


def view_with(log: CommittedLog, seqs: list[int | str], start: int = 0) -> SubscriberView:
    view = SubscriberView("sub", IBM, SubjectTracker(IBM), start_seq=start)
    for seq in seqs:
        if isinstance(seq, str):
            view.events.append((seq, None))
        else:
            view.events.append(("message", log.by_key[(IBM, 700, seq)]))
    return view


def test_a_faithful_subscriber_passes() -> None:
    log = committed_log(4)
    check_subscriber(view_with(log, [1, 2, 3, 4]), log, final=True)
    check_subscriber(view_with(log, [3, 4], start=2), log, final=True)
    check_subscriber(view_with(log, [1, "resync:evicted", 4]), log, final=True)
    check_subscriber(view_with(log, [1, 2, "resync:lagging", 3, 4]), log, final=True)


@pytest.mark.parametrize(
    ("seqs", "complaint"),
    [
        ([1, 2, 2, 3, 4], "wanted 3"),  # a duplicate
        ([1, 3, 4], "wanted 2"),  # a silent gap
        ([1, 2, "resync:lagging", 4], "wanted 3"),  # a resync that does not explain a skip
        ([2, 1, 3, 4], "wanted 1"),  # out of order
        ([1, 2, 3], "stopped at seq 3 of 4"),  # an acknowledged message never arrived
        ([1, "resync:unknown epoch", 2, 3, 4], "resync:unknown epoch"),
    ],
)
def test_an_unfaithful_subscriber_fails(seqs: list[int | str], complaint: str) -> None:
    log = committed_log(4)
    with pytest.raises(AssertionError, match=complaint):
        check_subscriber(view_with(log, seqs), log, final=True)


def test_a_message_that_was_never_committed_fails() -> None:
    log = committed_log(2)
    view = view_with(log, [1])
    view.events.append(("message", Message(IBM, b"anon#9", epoch=700, seq=2)))
    with pytest.raises(AssertionError, match="differs"):
        check_subscriber(view, log, final=False)
    view.events[-1] = ("message", Message(IBM, b"anon#9", epoch=700, seq=3))
    with pytest.raises(AssertionError, match="never committed"):
        check_subscriber(view, log, final=False)


def test_a_data_resync_while_the_cache_reaches_back_fails() -> None:
    view = SubscriberView("sub", IBM, SubjectTracker(IBM), start_seq=0)
    with pytest.raises(AssertionError, match="cache reaches back"):
        view.take(ops.SubjectStatus(ops.Status.DATA_RESYNC, IBM, Position(700, 3)), None)
    view.take(ops.SubjectStatus(ops.Status.DATA_RESYNC, IBM, Position(700, 3)), "evicted")
    with pytest.raises(AssertionError, match="DATA_SYNC but evicted"):
        view.take(ops.SubjectStatus(ops.Status.DATA_SYNC, IBM, Position(700, 3)), "evicted")


def test_the_log_refuses_a_reused_position_a_hole_and_a_reordered_publisher() -> None:
    log = committed_log(2)
    (m,) = log.batches[-1].messages
    with pytest.raises(AssertionError, match="names two messages"):
        log.append(CommittedBatch(3, (replace(m, content=b"anon#7"),), (("a", 7),)))
    with pytest.raises(AssertionError, match="hole"):
        log.append(CommittedBatch(3, (replace(m, content=b"anon#7", seq=4),), (("a", 7),)))
    log.append(CommittedBatch(3, (replace(m, content=b"p0#5", seq=3),), (("a", 8),)))
    with pytest.raises(AssertionError, match="reordered"):
        log.append(CommittedBatch(4, (replace(m, content=b"p0#4", seq=4),), (("a", 9),)))


def test_a_member_that_skipped_a_batch_fails() -> None:
    log = committed_log(3)
    replica = Replica(Hub(epoch=UNNUMBERED_EPOCH))
    replica.offer(log.batches[0], 0.0)
    check_member("m", replica.hub, 1, log, max_cached=1000)
    with pytest.raises(AssertionError, match="differs from the committed log"):
        check_member("m", replica.hub, 2, log, max_cached=1000)


# --- links, sync answers, publish answers ------------------------------------------------


def hub_sync_at(log: CommittedLog, clsn: int, max_cached: int = 1000) -> CacheSync:
    replica = Replica(Hub(epoch=UNNUMBERED_EPOCH, max_cached_messages=max_cached))
    for batch in log.batches[:clsn]:
        replica.offer(batch, 0.0)
    sync = replica.make_sync()
    assert sync is not None
    return sync


def test_a_faithful_link_passes() -> None:
    log = committed_log(5)
    contract = LinkContract("edge", after=1, max_cached=1000)
    contract.check(link.Batch(log.batches[1]), log)
    contract.check(link.Sync(hub_sync_at(log, 4)), log)
    contract.check(link.Batch(log.batches[4]), log)
    assert contract.after == 5


@pytest.mark.parametrize(
    ("after", "op", "complaint"),
    [
        (2, lambda log: link.Batch(log.batches[1]), "batch 2 again"),
        (1, lambda log: link.Batch(log.batches[2]), "batch 3 after 1: a hole"),
        (3, lambda log: link.Sync(hub_sync_at(log, 2)), "sync at clsn 2, behind its 3"),
        (1, lambda log: link.Sync(CacheSync(3, ())), "not what the committed log holds"),
        (0, lambda log: link.Batch(replace(log.batches[0], origins=(("x", 9),))),
         "not the committed one"),
    ],
)
def test_an_unfaithful_link_fails(after: int, op: Any, complaint: str) -> None:
    log = committed_log(4)
    with pytest.raises(AssertionError, match=complaint):
        LinkContract("edge", after=after, max_cached=1000).check(op(log), log)


def test_sync_answers() -> None:
    log = committed_log(4)
    whole = link.Sync(hub_sync_at(log, 3))
    check_sync_answer(whole, floor=3, giver_needed_sync=False, log=log, max_cached=1000)
    check_sync_answer(link.SyncRefused(1, "behind"), floor=3, giver_needed_sync=True,
                      log=log, max_cached=1000)
    with pytest.raises(AssertionError, match="needs a sync gave one"):
        check_sync_answer(whole, floor=3, giver_needed_sync=True, log=log, max_cached=1000)
    with pytest.raises(AssertionError, match="answers a request for clsn 4"):
        check_sync_answer(whole, floor=4, giver_needed_sync=False, log=log, max_cached=1000)
    empty = link.Sync(CacheSync(3, ()))
    with pytest.raises(AssertionError, match="not what the committed log holds"):
        check_sync_answer(empty, floor=3, giver_needed_sync=False, log=log, max_cached=1000)


def test_publish_answers() -> None:
    log = committed_log(2)
    mine, never = Message(IBM, b"anon#1"), Message(IBM, b"anon#9")

    def answer(status: ops.Status, seq: int | None = None, reason: str | None = None) -> Any:
        position = None if seq is None else Position(700, seq)
        return ops.PublishStatus(status, None, IBM, position, reason)

    ok, failed = ops.Status.PUBLISH_OK, ops.Status.PUBLISH_FAILED
    check_publish_answers(mine, [answer(ok, 2)], log)
    check_publish_answers(mine, [answer(failed, reason="outcome unknown: no commit")], log)
    check_publish_answers(never, [answer(failed, reason="not published: QUEUE_FULL")], log)
    with pytest.raises(AssertionError, match="false PUBLISH_OK"):
        check_publish_answers(mine, [answer(ok, 1)], log)
    with pytest.raises(AssertionError, match="after PUBLISH_FAILED"):
        check_publish_answers(mine, [answer(failed, reason="not published: LEADER_CHANGED")], log)
    with pytest.raises(AssertionError, match="answered 2 times"):
        check_publish_answers(mine, [answer(ok, 2), answer(ok, 2)], log)
