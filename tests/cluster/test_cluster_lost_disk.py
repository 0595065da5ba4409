"""A seed that lost its ClusterDataDir while the leader is down, with real member
processes (cluster/raft_votes.py; the same on simulated nodes: test_raft_votes.py).

Three seeds A (the leader), B and C. C is SIGKILLed, and A and B acknowledge a batch of
publishes C never receives (C's journal stays on disk). Then A is SIGKILLed, B is
SIGKILLed and restarted on an empty ClusterDataDir, and C is restarted: the seeds up
are B, empty, and C, which lacks that batch. Only A holds it.

- With the rule, B does not vote ("started with an empty ClusterDataDir"), so no leader
  is elected and no publish is acknowledged until A returns; then the cluster recovers
  and every acknowledged message is delivered, at its position.
- With the rule switched off (the test-only ``MIGRATORY_TEST_RAFT=votes-on-empty-disk``,
  pysyncobj's own voting), B votes for C, C leads without that batch and gives its
  positions to other messages: the planted loss, seen by the same check.

A brand-new cluster (every seed empty) still elects: each test starts with one.
"""

from __future__ import annotations

import contextlib
import shutil
import time
from pathlib import Path

import pytest
from cluster_fixture import LocalCluster
from cluster_load import LoadPublisher, LoadSubscriber, delivery_problems

from cluster.raft_votes import TEST_SWITCH, VOTES_ON_EMPTY_DISK
from migratory.model.position import Position

WINDOW = 4.0
"""Seconds with A down, B empty and C behind (publishes offered meanwhile)."""
EMPTY_LOG = "started with an empty ClusterDataDir"


def publish(cluster: LocalCluster, ports: list[int], seconds: float, tag: str) -> LoadPublisher:
    publisher = LoadPublisher(ports, rate=300, duration=seconds, tag=tag)
    publisher.start()
    publisher.join(seconds + 20)
    assert not publisher.is_alive()
    return publisher


def acked_of(publishers: list[LoadPublisher]) -> dict[str, list[tuple[bytes, Position]]]:
    acked: dict[str, list[tuple[bytes, Position]]] = {}
    for publisher in publishers:
        for subject, messages in publisher.acked_messages().items():
            acked.setdefault(subject, []).extend(messages)
    return acked


class LostDisk:
    """The run above; what it saw is kept on the instance."""

    def __init__(self, tmp_path: Path) -> None:
        self.cluster = LocalCluster(tmp_path, members=3, seeds=3)
        self.tmp_path = tmp_path

    def run(self, *, wait_for_a_leader: float = 0.0) -> None:
        """``wait_for_a_leader``: seconds to wait, after the window, for B or C to lead
        before A is started again (the planted run: a slow box does not hide the loss)."""
        cluster = self.cluster
        cluster.start_all()
        cluster.wait_ready(timeout=30)  # a brand-new cluster of empty seeds elects
        a = cluster.leader()
        b, c = (a + 1) % 3, (a + 2) % 3
        self.a, self.b, self.c = a, b, c
        self.before = publish(cluster, [cluster.port(a)], 1.0, "a")
        assert len(self.before.acked) > 150, self.before.summary()
        cluster.kill(c)
        self.without_c = publish(cluster, [cluster.port(a)], 1.0, "b")
        assert len(self.without_c.acked) > 150, self.without_c.summary()
        cluster.kill(a)
        cluster.kill(b)
        shutil.rmtree(self.tmp_path / "data" / f"migratory-{b}")
        cluster.start(b)
        cluster.start(c)
        self.window = publish(cluster, [cluster.port(b), cluster.port(c)], WINDOW, "w")
        deadline = time.monotonic() + wait_for_a_leader
        self.leaders_in_window = [i for i in (b, c) if self._state(i) == "leader"]
        while not self.leaders_in_window and time.monotonic() < deadline:
            time.sleep(0.1)
            self.leaders_in_window = [i for i in (b, c) if self._state(i) == "leader"]
        cluster.start(a)

    def _state(self, i: int) -> str | None:
        try:
            return self.cluster.status(i).get("raft_state")
        except OSError:
            return None

    def problems(self, member: int) -> list[str]:
        """What a subscriber on ``member``, resuming from the first acknowledged
        position of each subject, finds wrong against every acknowledged publish."""
        acked = acked_of([self.before, self.without_c, self.window])
        positions = {s: messages[0][1] for s, messages in self.before.acked_messages().items()}
        resumer = LoadSubscriber([self.cluster.port(member)], positions=positions, duration=20)
        resumer.start()
        wanted = {content for messages in acked.values() for content, _ in messages}
        wanted -= {messages[0][0] for messages in self.before.acked_messages().values()}
        with contextlib.suppress(TimeoutError):  # the problems say what is missing
            resumer.wait_for(wanted, 8)
        resumer.stop()
        return delivery_problems(resumer.messages(), acked, after=positions)


@pytest.mark.slow
def test_an_empty_seed_does_not_vote_while_the_leader_is_down(tmp_path: Path) -> None:
    run = LostDisk(tmp_path)
    try:
        run.run()
        assert run.leaders_in_window == []
        assert run.window.acked == {}, "acknowledged while only A held the last batch"
        # B and C turn clients away meanwhile (1013, not caught up with Raft) or fail them
        turned_away = any("not caught up with Raft" in e for e in run.window.errors)
        refused = len(run.window.failed) + len(run.window.unanswered)
        assert turned_away or refused, (run.window.summary(), run.window.errors[-3:])
        assert EMPTY_LOG in run.cluster.log(run.b)
        run.cluster.wait_ready(timeout=30)
        assert run.problems(run.b) == []
        after = publish(run.cluster, [run.cluster.port(run.b)], 0.5, "z")
        assert len(after.acked) > 50, after.summary()
        assert run.cluster.exited() == {}
        print(f"A={run.a} B={run.b} C={run.c}; window: {run.window.summary()}")
    finally:
        run.cluster.stop()


@pytest.mark.slow
def test_planted_pysyncobj_voting_loses_what_was_acknowledged(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(TEST_SWITCH, VOTES_ON_EMPTY_DISK)  # the member processes inherit it
    run = LostDisk(tmp_path)
    try:
        run.run(wait_for_a_leader=10.0)
        assert "TEST RAFT SWITCH ON" in run.cluster.log(run.b)
        assert run.leaders_in_window, "B or C led without the last batch"
        assert EMPTY_LOG not in run.cluster.log(run.b)
        deadline = time.monotonic() + 20
        while not all(run.cluster.ready(i) for i in (run.b, run.c)):
            assert time.monotonic() < deadline, "B and C not ready"
            time.sleep(0.1)
        problems = run.problems(run.c)
        print(f"A={run.a} B={run.b} C={run.c}; window: {run.window.summary()}; "
              f"leaders in the window: {run.leaders_in_window}; {len(problems)} problems, "
              f"first {problems[:3]}")
        assert problems, "the planted bug must be seen"
    finally:
        run.cluster.stop()
