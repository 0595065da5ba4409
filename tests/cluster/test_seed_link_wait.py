"""A (re)started seed is not ready until every other seed has a Raft link with it, at
most LINK_WAIT (cluster/seed_link_wait.py): the PDB counts a seed healthy once ready,
and a node drain took a second seed while the third still dialled the first's old IP."""

from __future__ import annotations

import logging
import time
from collections import deque
from types import SimpleNamespace

import pytest

from cluster.raft_status import RaftStatus
from cluster.seed_link_wait import LINK_WAIT, unresolved_seeds
from cluster.seed_readiness import SeedReadiness

SEED_0, SEED_2 = "migratory-0.migratory-seeds:9002", "migratory-2.migratory-seeds:9002"


def status(after: float, linked: tuple[str, ...], **more: object) -> RaftStatus:
    """Seed 1's status, just published, ``after`` seconds past its start: caught up,
    with a leader."""
    now = time.monotonic()
    fields: dict[str, object] = dict(
        state="follower", leader=SEED_0, ready=True, at=now,
        started=now - after, seeds=(SEED_0, SEED_2), linked=linked,
    )
    fields.update(more)
    return RaftStatus(**fields)  # type: ignore[arg-type]


def test_a_restarted_seed_is_not_ready_until_the_seed_that_dials_it_linked() -> None:
    """Seed 1's new pod linked with seed 0 (a leader, caught up): before, ready at once,
    while seed 2 still dialled its old IP."""
    readiness = SeedReadiness(deque())
    reason = readiness.reason(status(2.0, (SEED_0,)))
    assert reason is not None and f"waiting for a Raft link with seeds {SEED_2}" in reason
    assert "(at most 35 s after this seed started" in reason
    assert readiness.reason(status(9.0, (SEED_0,))) == reason  # (each change is logged)
    assert readiness.reason(status(9.5, (SEED_0, SEED_2))) is None


def test_a_seed_that_has_been_ready_stays_ready_when_another_seed_goes() -> None:
    """Else losing one seed would make every seed not ready (the whole StatefulSet)."""
    readiness = SeedReadiness(deque())
    assert readiness.reason(status(1.0, (SEED_0, SEED_2))) is None  # a brand-new cluster
    assert readiness.reason(status(60.0, (SEED_0,))) is None
    assert readiness.reason(status(61.0, ())) is None  # (a lost leader has its own reason)


def test_linked_all_while_catching_up_ends_the_wait_too() -> None:
    readiness = SeedReadiness(deque())
    catching_up = readiness.reason(status(1.0, (SEED_0, SEED_2), ready=False))
    assert catching_up == "member has not caught up with Raft yet"
    assert readiness.reason(status(5.0, (SEED_0,))) is None  # seed 2 went meanwhile


def test_a_seed_that_never_links_is_waited_for_at_most_link_wait(
    caplog: pytest.LogCaptureFixture,
) -> None:
    readiness = SeedReadiness(deque())
    assert readiness.reason(status(LINK_WAIT - 0.1, (SEED_0,))) is not None
    with caplog.at_level(logging.WARNING, logger="migratory.cluster"):
        assert readiness.reason(status(LINK_WAIT, (SEED_0,))) is None
    said = [r.getMessage() for r in caplog.records]
    assert len(said) == 1 and f"seeds {SEED_2} have not linked with this seed in 35 s" in said[0]
    caplog.clear()
    assert readiness.reason(status(LINK_WAIT + 1, (SEED_0,))) is None
    assert not caplog.records  # said once


def test_a_seed_whose_name_does_not_resolve_is_not_waited_for() -> None:
    """Its pod is gone (the seeds' Service publishes not-ready pods, not absent ones)."""
    readiness = SeedReadiness(deque())
    assert readiness.reason(status(2.0, (SEED_0,), unresolved=(SEED_2,))) is None


def test_a_seed_that_refuses_this_ones_dials_is_named_with_the_likely_cause() -> None:
    """A peer with another ClusterPassword (or a clock far off) closes this seed's dials:
    said as before, now also while the seed is caught up through the third seed."""
    readiness = SeedReadiness(deque())
    reason = readiness.reason(status(3.0, (SEED_0,), refused_by=(SEED_2,)))
    assert reason is not None and "waiting for a Raft link with seeds" in reason
    assert f"seeds {SEED_2} close its Raft connections unanswered" in reason


def test_another_reason_comes_first() -> None:
    readiness = SeedReadiness(deque())
    reason = readiness.reason(status(3.0, (SEED_0,), stopped="the disk is full"))
    assert reason == "Raft stopped: the disk is full"


def test_only_seeds_not_linked_are_looked_up() -> None:
    nodes = [SimpleNamespace(id=f"{host}:9002", host=host) for host in ("a", "b", "c")]
    looked_up: list[str] = []

    def resolve(host: str) -> str | None:
        looked_up.append(host)
        return None if host == "c" else "10.0.0.9"

    found = unresolved_seeds(nodes, lambda node: node.host == "a", resolve)
    assert found == ("c:9002",) and looked_up == ["b", "c"]


def test_no_wait_with_cluster_seed_link_wait_0() -> None:
    """A loopback cluster's setting (cluster/tooling.py): no cluster DNS to wait for."""
    assert SeedReadiness(deque(), link_wait=0).reason(status(2.0, (SEED_0,))) is None
