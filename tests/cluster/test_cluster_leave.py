"""A seed whose Raft node stopped leaves through another seed (``cluster_leave``),
played step by step: what its clients are promised (docs/cluster.md "Its own clients")
beyond what the invariants ask -- their publishes taken before the stop are
acknowledged through the other seed, in their order, at one position each, and its
subscriber misses nothing across the drain. Each planted variant of the product's
objects breaks one of those promises; the search finds those the invariants see
(``test_cluster_planted``)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import cluster_leave
import pytest
from cluster_machine import ClusterMachine
from cluster_world import SEEDS
from pysyncobj import FAIL_REASON

from cluster.publishing import ClusterPublishing
from cluster.raft import DEFINITE_FAILURES
from cluster.raft_outcomes import CLOSED_NAME, fail, raft_failed
from migratory.model.position import Position

IBM = "/Stocks/NYSE/IBM"
SEED_0 = SEEDS[0]


def play_leave(machine: type[ClusterMachine], *, passed_on: int, refused: bool,
               copies_first: bool = False, copies_refused: bool = False) -> ClusterMachine:
    """seed-0's client publishes three messages (p0) with a subscriber on seed-0; the
    first two are submitted to its Raft node, the third queued (``refused``: taken and
    refused ``RAFT_STOPPED``); its Raft node stops with the first ``passed_on`` of them on
    their way to the other seeds. It leaves through seed-1, those commit there (before
    its copies or, ``copies_first``, after; ``copies_refused``: seed-1 refuses them for
    sure), and the member catches up."""
    state = machine()
    state.start_cluster(max_cached=1000, shed_at_gap=False)
    state.subscribe(subject=IBM, pick=0)  # pick 0 of the serving: seed-0
    state.traffic(pick=0, rounds=[[(IBM, "p0", False)]], epoch_candidate=1, behind=set())
    state.publish(pick=0, burst=[(IBM, "p0", False)] * 2, submit=True)
    state.publish(pick=0, burst=[(IBM, "p0", False)])
    state.seed_raft_stops(pick=0, seed_pick=0, passed_on=passed_on, refused=refused,
                          dial=True)
    leaving = state.members[SEED_0]
    assert leaving.leaving and leaving.link is not None and leaving.link.seed == SEEDS[1]
    if copies_first:  # what it passed on reaches the leader late
        for entry in state.raft.in_flight:
            entry.overtaken = True
    else:
        state._commit(state.raft.committable(lambda _: True), 1)  # what it passed on
    refusal = FAIL_REASON.REQUEST_DENIED if copies_refused else None
    state._submit(leaving, refusal)  # its copies and its newer publish, through seed-1
    state._commit(state.raft.committable(lambda _: True), 1)
    state.deliver_everywhere(count=10)
    state.read(pick=0)
    state.publishes_are_answered_truthfully()
    state.subscribers_see_the_committed_log()
    return state


def answers(state: ClusterMachine) -> list[tuple[str, Position | None]]:
    return [(r.status.name, r.position) for p in state.publishes.values() for r in p.results]


def drain_and_heal(state: ClusterMachine) -> None:
    leaving = state.members[SEED_0]
    state.leaving_seed_drains(pick=0)
    assert not leaving.live and leaving.is_seed and not leaving.leaving
    (subscriber,) = state.subscribers
    assert subscriber.connection is not None and subscriber.connection.member is not leaving
    state.restart(pick=0, from_dump=False)
    assert leaving.live and leaving.is_seed
    state.teardown()


CASES = [(0, False, False), (1, False, False), (2, False, False), (2, True, False),
         (2, False, True), (1, True, True)]


def keeps_its_promises(state: ClusterMachine, *, passed_on: int, refused: bool) -> None:
    """Each publish acknowledged once, at its position, in the client's order; those
    taken before the stop forwarded again, those that committed already found numbered;
    the subscriber got every message."""
    epoch = state.log.batches[0].messages[0].epoch
    assert answers(state) == [("PUBLISH_OK", Position(epoch, seq)) for seq in range(1, 5)]
    publishing = state.members[SEED_0].stream.publishing  # type: ignore[union-attr]
    assert publishing.stats.resent == 2 + refused
    assert publishing.stats.repeats == passed_on
    (subscriber,) = state.subscribers
    assert [m.content for kind, m in subscriber.view.events if m is not None] == [
        f"p0#{n}".encode() for n in range(4)]


@pytest.mark.parametrize(("passed_on", "refused", "copies_first"), CASES)
def test_a_leaving_seeds_publishes_are_acknowledged_through_another_seed(
    passed_on: int, refused: bool, copies_first: bool
) -> None:
    state = play_leave(ClusterMachine, passed_on=passed_on, refused=refused,
                       copies_first=copies_first)
    keeps_its_promises(state, passed_on=passed_on, refused=refused)
    drain_and_heal(state)


# --- planted: each breaks a promise the played leave checks --------------------------


class SkippingOldestPublishing(ClusterPublishing):
    """Forwards its unanswered publishes again but the oldest."""

    def resend_unanswered(self, now: float) -> int:
        oldest = next(iter(self._pending), None)
        pending = self._pending.pop(oldest) if oldest is not None else None
        try:
            return super().resend_unanswered(now)
        finally:
            if pending is not None:
                self._pending = {oldest: pending, **self._pending}  # type: ignore[dict-item]


def fail_stopped(stream: Any, origins: Any, error: str, *, unknown: bool,
                 reply_to: str | None, now: float) -> bool:
    """Fails a seed's own publishes its stopped Raft node refused, as before."""
    if error == CLOSED_NAME and reply_to is None:
        fail(stream, origins, error, reply_to=None, now=now)
        return False
    return raft_failed(stream, origins, error, unknown=unknown, reply_to=reply_to, now=now)


@pytest.fixture
def stopped_refusals_fail(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    monkeypatch.setattr(cluster_leave, "raft_failed", fail_stopped)
    yield


def test_a_leave_that_skips_the_oldest_unanswered_publish_is_caught() -> None:
    machine = type("SkippingOldest", (ClusterMachine,),
                   {"publishing_class": SkippingOldestPublishing})
    state = play_leave(machine, passed_on=0, refused=False)
    with pytest.raises(AssertionError):
        keeps_its_promises(state, passed_on=0, refused=False)
    assert [r.results for r in state.publishes.values()][1] == []  # never answered


@pytest.mark.usefixtures("stopped_refusals_fail")
def test_a_leave_that_fails_what_its_stopped_node_refused_is_caught() -> None:
    state = play_leave(ClusterMachine, passed_on=2, refused=True)
    with pytest.raises(AssertionError):
        keeps_its_promises(state, passed_on=2, refused=True)
    assert [status for status, _ in answers(state)] == [
        "PUBLISH_OK", "PUBLISH_OK", "PUBLISH_OK", "PUBLISH_FAILED"]


class UnmarkedCopiesPublishing(ClusterPublishing):
    """Forwards its unanswered publishes again without marking them sent twice."""

    def resend_unanswered(self, now: float) -> int:
        count = super().resend_unanswered(now)
        for pending in self._pending.values():
            pending.resent = False
        return count


@pytest.mark.parametrize("publishing", [ClusterPublishing, UnmarkedCopiesPublishing])
def test_a_copy_refused_for_sure_while_the_first_may_commit(
    publishing: type[ClusterPublishing],
) -> None:
    """seed-1 refuses the copies for sure; what the stopped node had passed on commits
    after: believed, that refusal was a false PUBLISH_FAILED."""
    assert FAIL_REASON.REQUEST_DENIED in DEFINITE_FAILURES
    machine = type(publishing.__name__, (ClusterMachine,), {"publishing_class": publishing})
    if publishing is ClusterPublishing:
        state = play_leave(machine, passed_on=2, refused=False, copies_first=True,
                           copies_refused=True)
        assert [status for status, _ in answers(state)] == [
            "PUBLISH_OK", "PUBLISH_OK", "PUBLISH_OK", "PUBLISH_FAILED"]  # (p0#3: its first)
        drain_and_heal(state)
    else:
        with pytest.raises(AssertionError, match="after PUBLISH_FAILED"):
            play_leave(machine, passed_on=2, refused=False, copies_first=True,
                       copies_refused=True)
