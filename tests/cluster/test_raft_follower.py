"""The Raft follower rule, bytes-free: AppendEntries fed straight to one follower.

Each test builds a follower (no ticking thread, nothing connected) and hands it the
messages a leader would send, then reads its log and commit index.
"""

from __future__ import annotations

import gzip
import io
import logging
from collections.abc import Iterator
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from pysyncobj import SyncObj, SyncObjConf
from pysyncobj import pickle as pysyncobj_pickle
from pysyncobj import syncobj as pysyncobj_syncobj
from pysyncobj.node import TCPNode
from pysyncobj.syncobj import _RAFT_STATE
from pysyncobj.transport import Transport
from raft_planted import CommitsUnvouchedEntries, TruncatesAfterPrevious
from raft_sim import simulated

import cluster.raft_follower
from cluster.raft_follower import FollowerSafeSyncObj

LEADER = TCPNode("127.0.0.1:47902")


class Unconnected(Transport):  # type: ignore[misc]
    """No sockets: what the follower sends is kept in ``sent``."""

    def __init__(self, *args: Any) -> None:
        super().__init__(*args)
        self.sent: list[Any] = []

    def send(self, node: Any, message: Any) -> bool:
        self.sent.append(message)
        return True


def follower(cls: type[Any]) -> Any:
    conf = SyncObjConf(autoTick=False)  # no network here, so no password (its key costs 40 ms)
    node = cls(
        "127.0.0.1:47901", ["127.0.0.1:47902", "127.0.0.1:47903"], conf=conf,
        transportClass=Unconnected,
    )
    # an in-memory journal starts empty; no seed here answers the term query
    # (cluster/raft_term_query.py): this follower already knows the current term
    if isinstance(node, FollowerSafeSyncObj):
        node._term_quorum.waiting = False
        received = node._SyncObj__onMessageReceived

        def polled(source: Any, message: Any) -> None:  # one message a poll: its answers
            received(source, message)  # leave at its end (cluster/raft_held_answers.py)
            node._send_held_answers()

        node._SyncObj__onMessageReceived = polled
    return node


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


# --- the rule, for any log and any AppendEntries (steps of the proof in docs/cluster.md) ---

Entry = tuple[int, int]  # (index, term); an entry's command is determined by both


def command(index: int, term: int) -> bytes:
    return b"%d/%d" % (index, term)


@st.composite
def follower_and_message(draw: st.DrawFn) -> dict[str, Any]:
    """A follower's log, commit index and last applied; a leader's log sharing a prefix
    with it; and one AppendEntries cut from the leader's log (of any term, with any prev)."""
    held_terms = draw(st.lists(st.integers(1, 3), max_size=7).map(sorted))
    shared = draw(st.integers(0, len(held_terms)))
    first_new = held_terms[shared - 1] if shared else 1
    new_terms = draw(st.lists(st.integers(first_new, 5), max_size=6).map(sorted))
    leader_terms = held_terms[:shared] + new_terms
    held = [(1, 0)] + [(i + 2, t) for i, t in enumerate(held_terms)]
    leader = [(1, 0)] + [(i + 2, t) for i, t in enumerate(leader_terms)]
    prev = draw(st.integers(1, len(leader)))
    sent = leader[prev : prev + draw(st.integers(0, len(leader) - prev))]
    commit = draw(st.integers(1, len(held)))
    term = max([t for _, t in leader + held] + [1])
    return {
        "held": held,
        "commit": commit,
        "applied": draw(st.integers(1, commit)),
        "current_term": draw(st.integers(term - 1, term)),
        "message_term": draw(st.integers(term - 1, term)),
        "prev": prev,
        "prev_term": leader[prev - 1][1],
        "sent": sent,
        "leader_commit": draw(st.integers(1, len(leader))),
    }


def receive(cls: type[Any], case: dict[str, Any]) -> tuple[list[Entry], int, list[str], Any]:
    """Feed the message to a follower in the given state: its log, commit index, CRITICAL
    lines and reply."""
    node = follower(cls)
    try:
        log = node._SyncObj__raftLog
        log.clear()
        for index, term in case["held"]:
            log.add(command(index, term) if index > 1 else b"\x01", index, term)
        node._SyncObj__raftCurrentTerm = case["current_term"]
        node._SyncObj__raftCommitIndex = case["commit"]
        node._SyncObj__raftLastApplied = case["applied"]
        replies = node._SyncObj__transport.sent
        capture = LogLines()
        logging.getLogger().addHandler(capture)
        try:
            node._SyncObj__onMessageReceived(LEADER, {
                "type": "append_entries",
                "term": case["message_term"],
                "commit_index": case["leader_commit"],
                "entries": [(command(i, t), i, t) for i, t in case["sent"]],
                "prevLogIdx": case["prev"],
                "prevLogTerm": case["prev_term"],
            })
        finally:
            logging.getLogger().removeHandler(capture)
        after = [(index, term) for _, index, term in log[:]]
        return after, node._SyncObj__raftCommitIndex, capture.critical, replies
    finally:
        node.destroy()


class LogLines(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.CRITICAL)
        self.critical: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.critical.append(record.getMessage())


def accepted(case: dict[str, Any]) -> bool:
    held = dict(case["held"])
    return (
        case["message_term"] >= case["current_term"]
        and held.get(case["prev"]) == case["prev_term"]
    )


def check_truncates_only_at_a_term_conflict(cls: type[Any], case: dict[str, Any]) -> None:
    after, _, critical, _ = receive(cls, case)
    if not accepted(case):
        assert after == case["held"]  # a stale term or a gap: nothing changes
        return
    sent = dict(case["sent"])
    assert set(case["sent"]) <= set(after)  # the follower holds what the leader sent
    kept = set(after)
    for index, term in case["held"]:
        if (index, term) in kept:
            continue
        # a held entry goes only at, or after, an entry whose term the leader contradicts
        assert any(i <= index and sent[i] != t for i, t in case["held"] if i in sent), (
            f"entry {index} of term {term} dropped without a conflict"
        )
    removed = [i for i, t in case["held"] if (i, t) not in kept]
    assert bool(critical) == (bool(removed) and min(removed) <= case["applied"])


def check_commits_only_vouched_entries(cls: type[Any], case: dict[str, Any]) -> None:
    _, commit, _, replies = receive(cls, case)
    if not accepted(case):
        assert commit <= case["commit"]
        return
    vouched = case["sent"][-1][0] if case["sent"] else case["prev"]
    assert commit <= max(case["commit"], min(case["leader_commit"], vouched))
    assert commit >= min(case["leader_commit"], vouched)  # and it does advance that far
    assert replies[-1]["success"] and replies[-1]["next_node_idx"] == vouched + 1


PROPERTY = settings(max_examples=300, deadline=None, derandomize=True)


@PROPERTY
@given(follower_and_message())
def test_the_follower_truncates_only_at_a_term_conflict(case: dict[str, Any]) -> None:
    check_truncates_only_at_a_term_conflict(FollowerSafeSyncObj, case)


@PROPERTY
@given(follower_and_message())
def test_the_follower_commits_only_entries_the_message_vouched_for(case: dict[str, Any]) -> None:
    check_commits_only_vouched_entries(FollowerSafeSyncObj, case)


@pytest.mark.parametrize(
    ("planted", "check"),
    [
        (TruncatesAfterPrevious, check_truncates_only_at_a_term_conflict),
        (CommitsUnvouchedEntries, check_commits_only_vouched_entries),
    ],
)
def test_each_property_catches_its_planted_bug(planted: type[Any], check: Any) -> None:
    @PROPERTY
    @given(follower_and_message())
    def run(case: dict[str, Any]) -> None:
        check(planted, case)

    with pytest.raises(AssertionError):
        run()


# --- large entries, cut into parts by the leader ----------------------------------------------


def leader_parts(entry: tuple[bytes, int, int], batch_bytes: int) -> list[dict[str, Any]]:
    """The AppendEntries a pysyncobj 0.3.17 leader sends for one large entry."""
    with simulated(2, batch_bytes=batch_bytes) as world:
        leader, other = world.addresses
        node = world.nodes[leader]
        sent: list[dict[str, Any]] = []
        node._SyncObj__transport.send = lambda _node, message: sent.append(message) or True
        node._SyncObj__raftLog.add(*entry)
        node._SyncObj__raftNextIndex[node._SyncObj__transport.peers[other]] = entry[1]
        node._SyncObj__raftState = 2
        node._SyncObj__sendAppendEntries()
    return sent


def binary_command(size: int) -> bytes:
    return b"\x00" + bytes(range(256)) * (size // 256)


@pytest.mark.parametrize("size", [3 * 1024, 100 * 1024])
def test_a_large_binary_entry_arrives_whole(size: int) -> None:
    """pysyncobj's leader marks a part 'finish' by the command's length, not the pickled
    entry's (twice as long for binary data): a big entry comes as start, finish, finish."""
    batch_bytes = 2 * 1024 if size < 2**16 else 2**16
    entry = (binary_command(size), 2, 1)
    parts = leader_parts(entry, batch_bytes)
    assert [p["transmission"] for p in parts].count("finish") > 1  # the leader's quirk
    node = follower(FollowerSafeSyncObj)
    try:
        for part in parts:
            node._SyncObj__onMessageReceived(LEADER, part)
        assert node._SyncObj__raftLog[-1] == entry
    finally:
        node.destroy()


# --- the leader's dump (InstallSnapshot) -------------------------------------------------


def dump_message(serialized: Any, commit: int, term: int = 2) -> dict[str, Any]:
    """What pysyncobj's leader sends a follower that is behind its compacted log."""
    return {"type": "append_entries", "term": term, "commit_index": commit,
            "serialized": serialized}


def in_memory_dump(before_last: tuple[bytes, int, int], last: tuple[bytes, int, int]) -> bytes:
    """A dump as pysyncobj's in-memory serializer writes it (no consumers, no state)."""
    buffer = io.BytesIO()
    with gzip.GzipFile(fileobj=buffer, mode="wb") as g:
        pysyncobj_pickle.dump(({}, last, before_last, []), g)
    return buffer.getvalue()


@pytest.mark.parametrize(
    "serialized", [None, (b"first part", True, False)], ids=["dump-not-ready", "first-part"]
)
def test_pysyncobj_itself_commits_an_unverified_tail_on_a_dump_message(serialized: Any) -> None:
    """Why the dump path is overridden too; if this fails, pysyncobj changed."""
    node = follower(SyncObj)
    try:
        append(node, 1, FOUR, commit=1)  # a deposed leader's own tail, never committed
        node._SyncObj__onMessageReceived(LEADER, dump_message(serialized, commit=9))
        assert node._SyncObj__raftCommitIndex == 5  # entries 2..5 will be applied
    finally:
        node.destroy()


@pytest.mark.parametrize(
    "serialized", [None, (b"first part", True, False)], ids=["dump-not-ready", "first-part"]
)
def test_a_dump_message_vouches_for_no_held_entry(safe: Any, serialized: Any) -> None:
    append(safe, 1, FOUR, commit=1)
    safe._SyncObj__onMessageReceived(LEADER, dump_message(serialized, commit=9))
    assert safe._SyncObj__raftCommitIndex == 1
    assert safe._SyncObj__raftLeader == LEADER and safe._SyncObj__raftCurrentTerm == 2
    assert entries(safe)[1:] == FOUR  # kept until the dump replaces them


def test_a_whole_dump_replaces_the_log_and_commits_its_last_entry(safe: Any) -> None:
    append(safe, 1, FOUR, commit=1)
    dump = in_memory_dump((b"w", 8, 2), (b"x", 9, 2))
    half = len(dump) // 2
    safe._SyncObj__onMessageReceived(LEADER, dump_message((dump[:half], True, False), 12))
    assert safe._SyncObj__raftCommitIndex == 1
    safe._SyncObj__onMessageReceived(LEADER, dump_message((dump[half:], False, True), 12))
    assert entries(safe) == [(8, 2, b"w"), (9, 2, b"x")]
    assert safe._SyncObj__raftCommitIndex == 9 and safe._SyncObj__raftLastApplied == 9
    reply = safe._SyncObj__transport.sent[-1]
    assert reply == {"type": "next_node_idx", "next_node_idx": 10, "reset": False,
                     "success": True, "term": 2}


def test_the_commit_index_stays_within_the_leaders_after_a_dump(safe: Any) -> None:
    dump = in_memory_dump((b"w", 8, 2), (b"x", 9, 2))
    safe._SyncObj__onMessageReceived(LEADER, dump_message((dump, True, True), commit=9))
    assert safe._SyncObj__raftCommitIndex == 9


# --- where a mismatch sends the leader back to ------------------------------------------


def last_reply(node: Any) -> dict[str, Any]:
    reply: dict[str, Any] = node._SyncObj__transport.sent[-1]
    return reply


def test_a_mismatch_skips_the_whole_run_of_the_conflicting_term(safe: Any) -> None:
    append(safe, 1, FOUR, commit=1)  # 2..5 of term 1, a deposed leader's own tail
    safe._SyncObj__onMessageReceived(LEADER, {
        "type": "append_entries", "term": 3, "commit_index": 1, "entries": [],
        "prevLogIdx": 5, "prevLogTerm": 2,
    })
    assert last_reply(safe) == {"type": "next_node_idx", "next_node_idx": 2, "reset": True,
                                "success": False, "term": 3}


def test_later_answers_of_a_round_never_send_the_leader_back_up(safe: Any) -> None:
    append(safe, 1, FOUR, commit=1)
    for prev, prev_term in ((4, 2), (7, 2)):  # a round: a conflict, then beyond the log
        safe._SyncObj__onMessageReceived(LEADER, {
            "type": "append_entries", "term": 3, "commit_index": 1, "entries": [],
            "prevLogIdx": prev, "prevLogTerm": prev_term,
        })
    assert last_reply(safe)["next_node_idx"] == 2  # pysyncobj's follower says 6 here
    append(safe, 1, [(2, 2, b"x"), (3, 2, b"y")], commit=1, term=3)  # the leader's entries
    assert last_reply(safe)["success"] and last_reply(safe)["next_node_idx"] == 4
    safe._SyncObj__onMessageReceived(LEADER, {
        "type": "append_entries", "term": 3, "commit_index": 1, "entries": [],
        "prevLogIdx": 9, "prevLogTerm": 2,
    })
    assert last_reply(safe)["next_node_idx"] == 4  # the floor went with the conflict


def test_a_mismatch_never_sends_the_leader_below_the_commit_index(safe: Any) -> None:
    append(safe, 1, FOUR, commit=3)
    safe._SyncObj__onMessageReceived(LEADER, {
        "type": "append_entries", "term": 3, "commit_index": 3, "entries": [],
        "prevLogIdx": 5, "prevLogTerm": 2,
    })
    assert last_reply(safe)["next_node_idx"] == 4


def tick_stopped_midway(node: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """One tick of a linked follower whose election deadline is 10 ms away when the tick
    begins and long past when pysyncobj checks it: the process was stopped in between
    (SIGSTOP, a CPU limit's CFS quota; here the clock jumps in pysyncobj's once-a-second
    journal hook, which runs between the two)."""
    clock = [1000.0]
    for module in (pysyncobj_syncobj, cluster.raft_follower):
        monkeypatch.setattr(module, "monotonicTime", lambda: clock[0])
    node._SyncObj__connectedNodes.update(node.otherNodes)
    node._SyncObj__raftCurrentTerm = 2
    node._SyncObj__raftElectionDeadline = clock[0] + 0.01
    node._SyncObj__numOneSecondDumps = -(10**9)  # the hook runs in this tick

    def stopped() -> None:
        clock[0] += 1.0

    node._SyncObj__raftLog.onOneSecondTimer = stopped
    node._onTick(0)


def test_an_empty_started_seed_does_not_stand_when_its_deadline_passes_midway(
    safe: Any, monkeypatch: pytest.MonkeyPatch,
) -> None:
    """cluster/raft_votes.py: an empty-started seed that has not caught up never stands.
    The check came early in the tick; a deadline that passed before pysyncobj's own
    check (the process stopped in between) made it a candidate. Now the check is made
    at pysyncobj's, which asks whether it is linked only as it stands."""
    assert safe._empty_start.active  # (an in-memory journal starts empty)
    tick_stopped_midway(safe, monkeypatch)
    assert safe._SyncObj__raftState == _RAFT_STATE.FOLLOWER  # before: CANDIDATE
    assert safe._SyncObj__raftCurrentTerm == 2
