"""pysyncobj with the Raft follower rule for AppendEntries (paper §5.3, steps 3 and 4).

pysyncobj 0.3.17's follower deletes every entry after ``prevLogIdx`` before appending
the new ones, even entries it already holds from the same leader and has acknowledged.
Its leader re-sends overlapping ranges all the time (each success reply rewinds its
``nextIndex``), and a re-send may be cut into several messages by
``appendEntriesBatchSizeBytes``. Between two such messages the follower's log is
shorter than what it acknowledged; if the leader dies (or is paused, or partitioned)
right then, an election can pick a log without an entry that a majority had
acknowledged: a committed publication lost, and its position later given to another
message. The chaos suite found exactly that (two messages at one position).

:class:`FollowerSafeSyncObj` handles ordinary AppendEntries itself, as the paper says:

- an entry already held with the same term is kept, not deleted and re-added;
- only at the first entry whose term differs is the log truncated;
- entries beyond the message are kept (they may be the leader's too);
- the commit index advances only up to the last entry this message vouched for, so
  an unverified tail is never applied.

Every other message (votes, snapshots, commands, replies) goes to pysyncobj unchanged.
The override reaches pysyncobj's private attributes by their mangled names, which is why
the version is pinned in ``pyproject.toml``; ``tests/cluster/test_raft_follower.py``
checks both the bug in the base class and the fix, so a new pysyncobj version that
changes either shows up there.
"""

from __future__ import annotations

import logging
import pickle
from typing import Any

from pysyncobj import SyncObj
from pysyncobj.syncobj import _RAFT_STATE, monotonicTime

log = logging.getLogger("migratory.raft")


class FollowerSafeSyncObj(SyncObj):  # type: ignore[misc]
    """A ``SyncObj`` whose follower never drops entries it holds from the leader."""

    # pysyncobj's private state this class writes (annotations only, for mypy)
    _SyncObj__raftLeader: Any
    _SyncObj__raftCommitIndex: int
    _SyncObj__raftElectionDeadline: float
    _SyncObj__transferInProgress: bool
    _SyncObj__leaderCommitIndex: int | None
    _SyncObj__recvTransmission: Any

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        conf = kwargs.get("conf")
        if conf is not None and conf.dynamicMembershipChange:
            raise ValueError("FollowerSafeSyncObj does not support dynamicMembershipChange")
        super().__init__(*args, **kwargs)

    def _SyncObj__onMessageReceived(self, node: Any, message: dict[str, Any]) -> None:
        if (
            message.get("type") == "append_entries"
            and "prevLogIdx" in message
            and message["term"] >= self._SyncObj__raftCurrentTerm
        ):
            self._append_entries(node, message)
            return
        SyncObj._SyncObj__onMessageReceived(self, node, message)

    def _follow(self, node: Any, message: dict[str, Any]) -> None:
        """What any AppendEntries from a current leader does (as pysyncobj does it)."""
        if message["term"] > self._SyncObj__raftCurrentTerm:
            self._SyncObj__transferInProgress = False
        if not self._SyncObj__transferInProgress:
            self._SyncObj__raftElectionDeadline = (
                monotonicTime() + self._SyncObj__generateRaftTimeout()
            )
        if self._SyncObj__raftLeader != node:
            self._SyncObj__onLeaderChanged()
        self._SyncObj__raftLeader = node
        if message["term"] > self._SyncObj__raftCurrentTerm:
            self._SyncObj__setCurrentTerm(message["term"], None)
        self._SyncObj__setState(_RAFT_STATE.FOLLOWER)
        self._SyncObj__leaderCommitIndex = message["commit_index"]

    def _received_entries(self, node: Any, message: dict[str, Any]) -> list[Any] | None:
        """The message's entries; None while a large entry is still arriving in parts."""
        transmission = message.get("transmission")
        if transmission is None:
            return list(message.get("entries", []))
        if transmission == "start":
            self._SyncObj__recvTransmission = message["data"]
        elif transmission == "process":
            self._SyncObj__recvTransmission += message["data"]
        elif transmission == "finish":  # pysyncobj's own framing of one large entry
            data = self._SyncObj__recvTransmission + message["data"]
            self._SyncObj__recvTransmission = ""
            return [pickle.loads(data)]
        else:
            raise ValueError(f"unknown append_entries transmission {transmission!r}")
        self._SyncObj__sendNextNodeIdx(node, success=False, reset=False)
        return None

    def _append_entries(self, node: Any, message: dict[str, Any]) -> None:
        self._follow(node, message)
        entries = self._received_entries(node, message)
        if entries is None:
            return
        prev_idx, prev_term = message["prevLogIdx"], message["prevLogTerm"]
        held = self._SyncObj__getEntries(prev_idx)
        if not held:
            self._SyncObj__sendNextNodeIdx(node, success=False, reset=True)
            return
        if held[0][2] != prev_term:
            self._SyncObj__sendNextNodeIdx(node, nextNodeIdx=prev_idx, success=False, reset=True)
            return
        self._merge(held[1:], entries)
        vouched = entries[-1][1] if entries else prev_idx
        self._SyncObj__sendNextNodeIdx(node, nextNodeIdx=vouched + 1, success=True)
        self._advance_commit(message["commit_index"], vouched)

    def _merge(self, held: list[Any], entries: list[Any]) -> None:
        """Keep what matches, truncate at the first conflict, append the rest."""
        same = 0
        for have, new in zip(held, entries, strict=False):
            if have[1] != new[1] or have[2] != new[2]:
                break
            same += 1
        if same < len(held) and same < len(entries):
            conflict = entries[same][1]
            if conflict <= self._SyncObj__raftLastApplied:
                log.critical(
                    "Raft: the leader replaces applied entry %d (last applied %d): "
                    "state machine diverged",
                    conflict,
                    self._SyncObj__raftLastApplied,
                )
            self._SyncObj__deleteEntriesFrom(conflict)
        for entry in entries[same:]:
            self._SyncObj__raftLog.add(*entry)

    def _advance_commit(self, leader_commit: int, vouched: int) -> None:
        commit = self._SyncObj__raftCommitIndex
        last = self._SyncObj__getCurrentLogIndex()
        if commit > last:
            commit = last
        if leader_commit > commit:
            commit = max(commit, min(leader_commit, vouched))
        self._SyncObj__raftCommitIndex = commit
        self._SyncObj__raftLog.setRaftCommitIndex(commit)
