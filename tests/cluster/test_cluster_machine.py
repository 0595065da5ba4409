"""The cluster state machine (``cluster_machine``) run by hypothesis.

Each example starts 3 seeds and 2 non-seeds, plays up to ``stateful_step_count``
rules (publishes, commits, deliveries, subscribers, and the faults of
``cluster_faults``), checks the invariants after every step, then heals everything
and checks that the cluster converged without loss.
"""

from __future__ import annotations

from cluster_machine import ClusterMachine
from hypothesis import HealthCheck, settings

ClusterMachine.TestCase.settings = settings(
    max_examples=100,
    stateful_step_count=50,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
test_cluster_machine = ClusterMachine.TestCase


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
