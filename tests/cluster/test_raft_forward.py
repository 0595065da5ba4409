"""The hold of commands a follower seed could not forward (cluster/raft_forward.py):
its bounds, its order and its deadlines, without Raft; and the seed's deadline rule."""

from __future__ import annotations

from typing import Any

import pytest

from cluster.raft import DEFINITE_FAILURES, _fail_name, _SeedSyncObj
from cluster.raft_forward import (
    HOLD_MARGIN,
    NOT_SENT,
    ForwardHold,
    HoldsForwards,
    SendBy,
    hold_deadline,
)


def callback(send_by: float | None = None) -> Any:
    def call(result: Any, error: int) -> None:
        pass

    return call if send_by is None else SendBy(call, send_by)


def test_a_held_command_is_released_oldest_first_and_within_its_deadline() -> None:
    hold = ForwardHold(max_seconds=5.0)
    assert hold.hold(b"a", callback(), now=0.0)
    assert hold.hold(b"bb", callback(send_by=1.0), now=0.5)
    assert hold.hold(b"ccc", callback(), now=2.0)
    assert (len(hold), hold.held_bytes) == (3, 6)
    assert hold.expire(0.9) == []
    assert [h.command for h in hold.expire(1.0)] == [b"bb"]  # its own deadline, not 5 s
    assert [h.command for h in hold.expire(5.0)] == [b"a"]  # held 5 s: the age bound
    assert [h.command for h in hold.release(6.0)] == [b"ccc"]
    assert (len(hold), hold.held_bytes) == (0, 0)
    assert hold.statistics() == {
        "holding": 0, "holding_bytes": 0, "held": 3, "released": 1, "expired": 2, "refused": 0,
    }


def test_release_never_hands_out_a_command_past_its_deadline() -> None:
    hold = ForwardHold(max_seconds=5.0)
    hold.hold(b"late", callback(send_by=1.0), now=0.0)
    hold.hold(b"ok", callback(), now=0.0)
    assert [h.command for h in hold.release(1.0)] == [b"ok"]


def test_what_pysyncobj_did_not_take_goes_back_in_front_in_its_order() -> None:
    hold = ForwardHold()
    for command in (b"1", b"2", b"3"):
        hold.hold(command, callback(), now=0.0)
    released = hold.release(0.1)
    hold.hold(b"4", callback(), now=0.2)  # held meanwhile, behind them
    hold.put_back(released[1:])
    assert [h.command for h in hold.release(0.3)] == [b"2", b"3", b"4"]
    assert hold.stats.released == 4  # 1 taken (2 and 3 put back), then 2, 3 and 4


@pytest.mark.parametrize("limit", ["commands", "bytes"])
def test_a_full_hold_refuses_one_more(limit: str) -> None:
    hold = ForwardHold(max_commands=2) if limit == "commands" else ForwardHold(max_bytes=10)
    assert hold.hold(b"12345", callback(), now=0.0)
    assert hold.hold(b"12345", callback(), now=0.0)
    assert not hold.hold(b"1", callback(), now=0.0)
    assert len(hold) == 2 and hold.stats.refused == 1


def test_the_seeds_deadline_comes_before_the_publish_timeout() -> None:
    # own publishes: a margin before the oldest one's timeout (10 s)
    assert hold_deadline(now=3.0, oldest_submitted=1.0, publish_timeout=10.0,
                         forwarded=False) == 11.0 - HOLD_MARGIN
    # all of them timed out already: never sent once held
    assert hold_deadline(now=3.0, oldest_submitted=None, publish_timeout=10.0,
                         forwarded=False) == 3.0
    # a non-seed's: their timeout runs there, from before they came
    assert hold_deadline(now=3.0, oldest_submitted=None, publish_timeout=10.0,
                         forwarded=True) == 8.0


def test_a_command_never_sent_is_a_definite_failure_named_so() -> None:
    assert NOT_SENT in DEFINITE_FAILURES
    assert _fail_name(NOT_SENT) == "LEADER_UNREACHABLE"


def test_every_seed_holds_what_it_cannot_forward() -> None:
    assert issubclass(_SeedSyncObj, HoldsForwards)
