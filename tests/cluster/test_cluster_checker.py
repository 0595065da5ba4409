"""The cluster invariants are shown to fail: on planted bugs, and on hand-made histories."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import pytest
from cluster_checker import CommittedLog, SubscriberView, check_member, check_subscriber
from hypothesis import HealthCheck, Phase, settings
from hypothesis.stateful import run_state_machine_as_test
from test_cluster_machine import ClusterMachine

from cluster.coordination import UNNUMBERED_EPOCH, CommittedBatch, Coordinator, PublishRequest
from cluster.replica import Offer, Replica
from migratory.model.message import Message
from migratory.model.position import Position
from migratory.protocol import ops
from migratory.server.hub import Hub
from migratory_client.resume import SubjectTracker

IBM = "/Stocks/NYSE/IBM"


class SkippingReplica(Replica):
    """Planted bug: takes batch 2 as applied without applying it."""

    def offer(self, batch: CommittedBatch, now: float) -> Offer:
        if batch.clsn == 2 and self.applied_clsn == 1 and not self.needs_sync:
            self._applied_clsn = 2
            return Offer.APPLIED
        return super().offer(batch, now)


class SeqReusingCoordinator(Coordinator):
    """Planted bug: every message of a subject after its second gets seq 2 again."""

    def _number(self, epoch_candidate: int, *args: Any) -> Message:
        numbered = super()._number(epoch_candidate, *args)
        if numbered.seq > 2:
            self.seqs[numbered.subject] = 2
            return numbered.with_position(numbered.epoch, 2)
        return numbered


class SkippingMachine(ClusterMachine):
    replica_class = SkippingReplica


class SeqReusingMachine(ClusterMachine):
    coordinator_class = SeqReusingCoordinator


PLANTED = settings(
    max_examples=300,
    stateful_step_count=50,
    deadline=None,
    derandomize=True,
    database=None,
    phases=[Phase.generate],
    suppress_health_check=list(HealthCheck),
)


@pytest.mark.parametrize(
    ("machine", "complaint"),
    [
        (SkippingMachine, "differs from the committed log"),
        (SeqReusingMachine, "names two messages"),
    ],
)
def test_the_machine_catches_a_planted_bug(machine: type[ClusterMachine], complaint: str) -> None:
    with pytest.raises(AssertionError, match=complaint):
        run_state_machine_as_test(machine, settings=PLANTED)


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
    view.expected_cause = None
    with pytest.raises(AssertionError, match="cache reaches back"):
        view.take(ops.SubjectStatus(ops.Status.DATA_RESYNC, IBM, Position(700, 3)))


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
