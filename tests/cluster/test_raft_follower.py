"""The Raft follower rule, bytes-free: AppendEntries fed straight to one follower.

Each test builds a follower (no ticking thread, nothing connected) and hands it the
messages a leader would send, then reads its log and commit index.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from pysyncobj import SyncObj, SyncObjConf
from pysyncobj.node import TCPNode

from cluster.raft_follower import FollowerSafeSyncObj

LEADER = TCPNode("127.0.0.1:47902")


def follower(cls: type[Any]) -> Any:
    conf = SyncObjConf(autoTick=False, password="pw")
    return cls("127.0.0.1:47901", ["127.0.0.1:47902", "127.0.0.1:47903"], conf=conf)


@pytest.fixture
def safe() -> Iterator[Any]:
    node = follower(FollowerSafeSyncObj)
    yield node
    node.destroy()


def entries(node: Any) -> list[tuple[int, int, bytes]]:
    return [(idx, term, command) for command, idx, term in node._SyncObj__raftLog[:]]


def append(
    node: Any, prev: int, new: list[tuple[int, int, bytes]], commit: int, term: int = 1
) -> None:
    held = {idx: t for _, idx, t in node._SyncObj__raftLog[:]}
    node._SyncObj__onMessageReceived(
        LEADER,
        {
            "type": "append_entries",
            "term": term,
            "commit_index": commit,
            "entries": [(command, idx, t) for idx, t, command in new],
            "prevLogIdx": prev,
            "prevLogTerm": held.get(prev, 1),
        },
    )


FOUR = [(2, 1, b"a"), (3, 1, b"b"), (4, 1, b"c"), (5, 1, b"d")]


def test_pysyncobj_itself_drops_held_entries_on_an_overlapping_resend() -> None:
    """Why the override exists; if this fails, pysyncobj changed: re-check the override."""
    node = follower(SyncObj)
    try:
        append(node, 1, FOUR, commit=1)
        append(node, 2, [(3, 1, b"b")], commit=1)
        assert [idx for idx, _, _ in entries(node)] == [1, 2, 3]  # 4 and 5 are gone
    finally:
        node.destroy()


def test_an_overlapping_resend_keeps_every_held_entry(safe: Any) -> None:
    append(safe, 1, FOUR, commit=1)
    append(safe, 2, [(3, 1, b"b")], commit=1)
    assert entries(safe)[1:] == FOUR


def test_new_entries_after_the_held_ones_are_appended(safe: Any) -> None:
    append(safe, 1, FOUR[:2], commit=1)
    append(safe, 2, FOUR[1:], commit=1)
    assert entries(safe)[1:] == FOUR


def test_a_conflicting_term_truncates_from_the_first_conflict(safe: Any) -> None:
    append(safe, 1, FOUR, commit=1)
    append(safe, 3, [(4, 2, b"x")], commit=1, term=2)
    assert entries(safe)[1:] == [(2, 1, b"a"), (3, 1, b"b"), (4, 2, b"x")]


def test_commit_advances_only_as_far_as_the_message_vouched(safe: Any) -> None:
    append(safe, 1, FOUR, commit=1)  # entries 2..5 held, nothing committed yet
    # a new leader's heartbeat vouches for entry 3 only: 4 and 5 may not be its entries
    append(safe, 3, [], commit=5, term=2)
    assert safe._SyncObj__raftCommitIndex == 3
    append(safe, 5, [], commit=5, term=2)
    assert safe._SyncObj__raftCommitIndex == 5


def test_a_missing_previous_entry_is_refused(safe: Any) -> None:
    append(safe, 4, [(5, 1, b"d")], commit=1)
    assert [idx for idx, _, _ in entries(safe)] == [1]
