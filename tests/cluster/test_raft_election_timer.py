"""A follower's Raft thread wakes just past its election deadline, not at its next
50 ms tick (cluster/raft_election_timer.py): followers that ticked in step after the
leader died stood in the same millisecond and split the vote."""

from __future__ import annotations

from typing import Any

import pytest
from pysyncobj import SyncObjConf
from pysyncobj.syncobj import _RAFT_STATE, monotonicTime
from test_raft_follower import Unconnected

from cluster.raft_election_timer import PAST_DEADLINE, poll_timeout
from cluster.raft_follower import FollowerSafeSyncObj


@pytest.mark.parametrize(
    ("wait", "deadline", "leader", "expected"),
    [
        (0.05, 10.02, False, 0.02 + PAST_DEADLINE),  # the deadline comes first
        (0.05, 10.30, False, 0.05),  # the tick comes first
        (0.05, 9.90, False, 0.05),  # past (no connection to stand): no spin
        (0.05, 10.02, True, 0.05),  # a leader has no election deadline
        (0.0, 10.02, False, 0.0),  # a tick that must not wait
    ],
)
def test_poll_timeout(wait: float, deadline: float, leader: bool, expected: float) -> None:
    assert poll_timeout(wait, deadline, 10.0, leader=leader) == pytest.approx(expected)


def test_the_seed_node_polls_until_its_deadline() -> None:
    node: Any = FollowerSafeSyncObj(
        "127.0.0.1:47911", ["127.0.0.1:47912", "127.0.0.1:47913"],
        conf=SyncObjConf(autoTick=False), transportClass=Unconnected,
    )
    try:
        node._term_quorum.waiting = False
        waits: list[float] = []
        node._poller.poll = waits.append
        node._SyncObj__raftElectionDeadline = monotonicTime() + 0.02
        node._onTick(0.05)
        assert node._SyncObj__raftState == _RAFT_STATE.FOLLOWER
        assert waits and 0.015 < waits[-1] < 0.021
    finally:
        node.destroy()
