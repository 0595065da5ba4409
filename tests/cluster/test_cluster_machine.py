"""The cluster state machine (``cluster_machine``) run by hypothesis.

Each example starts 3 seeds and 2 non-seeds, plays up to ``stateful_step_count``
rules (publishes, commits, deliveries, subscribers, and the faults of
``cluster_faults``), checks the invariants after every step, then heals everything
and checks that the cluster converged without loss.
"""

from __future__ import annotations

import os
from collections.abc import Callable

from cluster_machine import ClusterMachine
from hypothesis import HealthCheck, Phase, settings

# No shrinking unless asked (MIGRATORY_SHRINK=1): the 100 examples pass in ~3 s, but
# shrinking two failures of 50 steps in CI (2026-11-28) ran into Hypothesis's own
# 5-minute limit. A failure is reported as found, the first one only: its steps (at
# most stateful_step_count) and the @reproduce_failure blob that replays it; locally the
# example database keeps it, so a run with MIGRATORY_SHRINK=1 starts from it.
SHRINK = os.environ.get("MIGRATORY_SHRINK") == "1"
ClusterMachine.TestCase.settings = settings(
    max_examples=100,
    stateful_step_count=50,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
    phases=[Phase.explicit, Phase.reuse, Phase.generate, *([Phase.shrink] if SHRINK else [])],
    report_multiple_bugs=SHRINK,
    print_blob=True,
)
test_cluster_machine = ClusterMachine.TestCase


def _check(state: ClusterMachine) -> None:
    state.members_hold_the_committed_log()
    state.members_never_move_back()
    state.publishes_are_answered_truthfully()
    state.subscribers_see_the_committed_log()


def _seed_0_crashed(state: ClusterMachine) -> list[Callable[[], object]]:
    """Both falsifying examples of 2026-11-28 began so."""
    return [lambda: state.start_cluster(max_cached=2, shed_at_gap=False),
            lambda: state.crash(pick=0),
            lambda: state.deliver_everywhere(count=1)]


def _play(state: ClusterMachine, steps: list[Callable[[], object]]) -> None:
    """A falsifying example's steps, the invariants checked after each."""
    for step in steps:
        step()
        _check(state)


def test_a_resume_held_across_a_crash_gets_data_sync_once_caught_up() -> None:
    """Found by hypothesis in CI (2026-11-28), the model's mistake, not the hub's: a
    subscriber resumed on a member that has not numbered its subject (``DATA_RESYNC`` at
    once, the resume held); the member crashed and jumped to its empty start, the resume
    still held; once the member caught up it got the missed messages and ``DATA_SYNC``,
    which the model took for a sync that should not have been."""
    IBM = "/Stocks/NYSE/IBM"
    state = ClusterMachine()

    def check() -> None:
        state.members_hold_the_committed_log()
        state.members_never_move_back()
        state.publishes_are_answered_truthfully()
        state.subscribers_see_the_committed_log()

    state.start_cluster(max_cached=2, shed_at_gap=False)
    check()
    state.seed_batches_late(count=1, seeds={"seed-0"})
    check()
    state.subscribe(pick=1, subject=IBM)
    check()
    state.traffic(behind=set(), epoch_candidate=1, pick=0, rounds=[[(IBM, "p0", False)]])
    check()
    state.lose_majority(burst=[(IBM, "p0", False)], compacted=False, pick=1, reason=4,
                        survivors=1)
    check()
    state.crash(pick=0)
    check()
    state.teardown()


def whole_restart(*, compacted: bool, from_dump: bool) -> None:
    """Every member, seeds and non-seeds, dies at once under load (a whole restart, as
    the chaos ``--scenario whole-restart`` does with processes), with subscribers on
    every member and publishes in flight; then every one starts again (the seeds from
    their dumps or their whole logs, the non-seeds empty). The invariants hold at every
    step and the teardown finds the cluster converged: every subscriber resumed from its
    position, without gap or duplicate, and every publish answered truthfully."""
    subjects = ("/Stocks/NYSE/IBM", "/Stocks/NASDAQ/GM", "/Scores/NBA/LAL")
    state = ClusterMachine()

    def check() -> None:
        state.members_never_move_back()
        state.members_hold_the_committed_log()
        state.publishes_are_answered_truthfully()
        state.subscribers_see_the_committed_log()

    state.start_cluster(max_cached=4)
    check()
    for pick in range(5):  # one subscriber on each member
        state.subscribe(subject=subjects[pick % 3], pick=pick)
        check()
    rounds = [[(s, "p0", False), (s, "p1", True)] for s in subjects]
    state.traffic(behind=set(), epoch_candidate=1, pick=0, rounds=rounds)
    check()
    committed = len(state.log)
    assert committed > 0 and len(state.subscribers) == 5
    state.deliver_everywhere(count=4)
    check()
    for pick in range(5):
        state.read(pick=pick)
        check()
    state.lose_majority(burst=[(subjects[0], "p0", False), (subjects[2], None, True)],
                        compacted=compacted, pick=2, reason=2, survivors=0)
    check()
    while state._live():  # the non-seeds too: every member is down
        state.crash(pick=0)
        check()
    assert all(s.connection is None for s in state.subscribers)
    while any(not m.live for m in state.members.values()):
        state.restart(pick=0, from_dump=from_dump)
        check()
    state.deliver_everywhere(count=4)
    check()
    for pick in range(5):
        state.read(pick=pick)
        check()
    state.teardown()


def test_a_whole_restart_after_compaction_from_the_dumps() -> None:
    whole_restart(compacted=True, from_dump=True)


def test_a_whole_restart_from_the_whole_logs() -> None:
    whole_restart(compacted=False, from_dump=False)


IBM = "/Stocks/NYSE/IBM"


class _Takes:
    """``st.data()`` for ``barrier``: every entry in doubt commits before it."""

    def draw(self, strategy: object, label: object = None) -> bool:
        return True


def test_a_raft_dump_behind_a_seed_that_took_a_peers_caches_is_refused() -> None:
    """Found by hypothesis in CI (2026-11-28, seed 8663...4571), the model's mistake: a
    seed restarted from its whole log while the others had compacted took a later batch
    first (``seed_batches_late``), asked a peer seed for its caches and jumped to clsn 6
    while its Raft log was at 3; the leader then sent it its dump at clsn 4. The stream
    refuses a dump behind it, changing nothing (its clients would move back), and goes
    on with the batches after it; the model asserted it always installs one."""
    state = ClusterMachine()
    steps: list[Callable[[], object]] = [
        *_seed_0_crashed(state),
        lambda: state.time_passes(),
        lambda: state.traffic(behind=set(), epoch_candidate=1, pick=0,
                              rounds=[[(IBM, None, False)]]),
        lambda: state.traffic(behind=set(), epoch_candidate=1, pick=0,
                              rounds=[[(IBM, None, False)], [(IBM, None, False)] * 2,
                                      [(IBM, "p0", False)]]),
        lambda: state.lose_majority(burst=[(IBM, None, False)], compacted=True, pick=0,
                                    reason=4, survivors=1),
        lambda: state.time_passes(),
        lambda: state.restart(from_dump=False, pick=0),
        lambda: state.restart(from_dump=False, pick=0),
        lambda: state.seed_batches_late(count=1, seeds={"seed-2"}),
        lambda: state.publish(burst=[(IBM, None, False)] * 3, pick=0, submit=False),
        lambda: state.publish(burst=[(IBM, None, False)] * 2, pick=0, submit=True),
        lambda: state.barrier(data=_Takes(), epoch_candidate=1),  # type: ignore[arg-type]
        lambda: state.deliver_everywhere(count=3),
        lambda: state.crash(pick=0),
    ]
    _play(state, steps)
    seed_2 = state.members["seed-2"]
    assert (seed_2.feed, seed_2.applied) == (3, 6)  # Raft at 3, its stream at 6
    assert [(m.name, leader) for m, leader in state._behind_a_dump()] == [("seed-2", "seed-1")]
    assert state.raft.dumps["seed-1"][0] == 4
    state.raft_sends_dump(pick=0)
    _check(state)
    assert (seed_2.feed, seed_2.applied) == (4, 6)
    state.teardown()


def test_a_dead_non_seeds_forward_committed_after_its_publishers_next() -> None:
    """Found by hypothesis in CI (2026-11-28, with the rule ``forwards_overtaken``), the
    model's mistake: p0 published through a non-seed that forwarded it to seed-2 and
    died unanswered; p0 went on through another member (an origin of its own), and the
    dead non-seed's forward reached seed-2 late and committed after p0's next message.
    The cluster numbers each member process's publishes in the order it took them (an
    older request of an origin is dropped); across origins it cannot know a publisher,
    and p0's first publish was never answered (outcome unknown). The checker asserted
    each publisher's order across members; it now does through each origin."""
    state = ClusterMachine()
    steps: list[Callable[[], object]] = [
        *_seed_0_crashed(state),
        lambda: state.publish(burst=[(IBM, "p0", False)], pick=2, submit=True),
        lambda: state.crash(pick=0),
        lambda: state.forwards_overtaken(),
        lambda: state.traffic(behind=set(), epoch_candidate=1, pick=0,
                              rounds=[[(IBM, "p0", False)]]),
    ]
    _play(state, steps)
    assert not state.members["edge-0"].live
    [batch] = state.log.batches
    assert [m.content for m in batch.messages] == [b"p0#1", b"p0#0"]
    assert [origin for origin, _ in batch.origins] == ["seed-1#1", "edge-0#1"]
    assert state.publishes[b"p0#0"].results == []  # never answered: edge-0 died
    state.teardown()
