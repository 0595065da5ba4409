"""The workload plan: seeded, every subject watched by both kinds, subsets checkable."""

from __future__ import annotations

import pytest

from chaos.plan import HISTORY, plan_workload
from chaos.workload import Arrivals, parse_id


@pytest.mark.parametrize("seed", [1, 2, 77])
def test_the_default_plan_is_the_load_asked_for(seed: int) -> None:
    plan = plan_workload(seed, members=5)
    assert plan == plan_workload(seed, members=5)
    assert len(plan.subjects) == len(set(plan.subjects)) == 50
    assert plan.rate == pytest.approx(420.0)
    kinds = [p.kind for p in plan.publishers]
    assert kinds.count("sdk") == 4 and kinds.count("raw") == 4
    subscribers = plan.subscribers
    assert len(subscribers) == 20
    assert {s.kind for s in subscribers} == {"sdk", "raw"}
    for kind in ("sdk", "raw"):
        watched = {x for s in subscribers if s.kind == kind for x in s.subjects}
        assert watched == set(plan.subjects), f"a subject no {kind} subscriber watches"
    for s in subscribers:
        assert 2 <= len(s.subjects) < len(plan.subjects) // 2, "a subset, small enough to check"
        assert set(s.subjects) <= set(plan.subjects)
    late = [s for s in subscribers if s.history]
    assert {s.kind for s in late} == {"sdk", "raw"}
    assert all(s.history == HISTORY and s.start_after > 0 for s in late)
    assert all(s.start_after == 0 for s in subscribers if not s.history)
    assert {p.prefer for p in plan.publishers} == set(range(5))
    assert plan_workload(seed + 1, members=5) != plan


def test_names_tell_the_checker_and_the_fault_switch_who_is_who() -> None:
    plan = plan_workload(3, members=5)
    assert all(p.name.startswith("p") for p in plan.publishers)  # every msg_id starts with p
    assert {s.name[0] for s in plan.subscribers if s.kind == "raw"} == {"a"}
    assert {s.name[0] for s in plan.subscribers if s.kind == "sdk"} == {"s"}


def test_arrivals_are_seeded_and_mixed() -> None:
    plan = plan_workload(5, members=5)
    pub = plan.publishers[-1]
    first = Arrivals(5, plan, pub)
    again = Arrivals(5, plan, pub)
    picks = [first.next() for _ in range(400)]
    assert picks == [again.next() for _ in range(400)]
    assert len({p[0] for p in picks}) == 400
    assert all(parse_id(content) == msg_id for msg_id, _, content, *_ in picks)
    assert all(fields["msg_id"] == msg_id for msg_id, _, _, fields, *_ in picks)
    retained = sum(p[4] for p in picks)
    with_fields = sum(len(p[3]) > 1 for p in picks)
    assert 60 < retained < 180 and 140 < with_fields < 260
    assert {p[1] for p in picks} <= set(plan.subjects)


def test_small_plans_for_the_tests() -> None:
    plan = plan_workload(1, members=3, subjects=6, rate=60, sdk_publishers=1,
                         raw_publishers=1, sdk_subscribers=2, auditors=1)
    assert len(plan.subjects) == 6 and len(plan.subscribers) == 3
    assert {x for s in plan.subscribers if s.kind == "raw" for x in s.subjects} == set(
        plan.subjects
    )
    with pytest.raises(ValueError):
        plan_workload(1, members=3, subjects=0)


def test_arrivals_keep_their_rate_and_drop_what_the_generator_is_late_for() -> None:
    plan = plan_workload(2, members=5, rate=800)  # 100/s for each of the 8 publishers
    arrivals = Arrivals(2, plan, plan.publishers[0])
    now, times = 0.0, []
    for _ in range(2000):  # a publisher that is always on time
        now = arrivals.due(now)
        times.append(now)
    assert arrivals.late == 0
    assert 18.0 < times[-1] < 22.0, "2,000 arrivals at 100/s take about 20 s"
    stalled = times[-1] + 5.0  # the generator was stuck for 5 s
    nxt = arrivals.due(stalled)
    assert nxt >= stalled - 1.0
    assert 300 < arrivals.late < 500, "about 4 s of arrivals dropped, the last 1 s kept"
    fresh, timed = Arrivals(2, plan, plan.publishers[0]), Arrivals(2, plan, plan.publishers[0])
    timed.due(0.0)
    timed.due(100.0)  # late: arrivals dropped
    assert [fresh.next() for _ in range(5)] == [timed.next() for _ in range(5)], (
        "what is published does not depend on timing"
    )
