"""Planted Raft bugs: each test of a safety property is shown to catch one of these."""

from __future__ import annotations

from typing import Any

from pysyncobj import SyncObj

from cluster.raft_follower import FollowerSafeSyncObj
from cluster.raft_prevote import REQUEST as PRE_VOTE


class TruncatesAfterPrevious(FollowerSafeSyncObj):  # type: ignore[misc]
    """pysyncobj 0.3.17's own rule: drop every entry after prevLogIdx, then append."""

    def _merge(self, held: list[Any], entries: list[Any]) -> None:
        if held:
            self._SyncObj__deleteEntriesFrom(held[0][1])
        for entry in entries:
            self._SyncObj__raftLog.add(*entry)


class CommitsUnvouchedEntries(FollowerSafeSyncObj):  # type: ignore[misc]
    """Advances the commit index over its whole log, not only what the leader vouched for."""

    def _advance_commit(self, leader_commit: int, vouched: int) -> None:
        super()._advance_commit(leader_commit, self._SyncObj__getCurrentLogIndex())


class VotesForAnyLog(FollowerSafeSyncObj):  # type: ignore[misc]
    """Grants its vote (and its pre-vote, cluster/raft_prevote.py) without checking that
    the candidate's log is as up to date."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._empty_start.active = False  # and without cluster/raft_votes.py's rule

    def _SyncObj__onMessageReceived(self, node: Any, message: dict[str, Any]) -> None:
        if message.get("type") in ("request_vote", PRE_VOTE):
            message = {**message, "last_log_term": 10**9, "last_log_index": 10**9}
        super()._SyncObj__onMessageReceived(node, message)


class CommitsOnEveryDumpPart(FollowerSafeSyncObj):  # type: ignore[misc]
    """pysyncobj 0.3.17's own handling of the leader's dump, as before commit 94114b5:
    every dump message (each part, or ``serialized: None``) moves the commit index to
    ``min(leader's commit, own log end)``, over a deposed leader's uncommitted tail."""

    def _install_dump(self, node: Any, message: dict[str, Any]) -> None:
        SyncObj._SyncObj__onMessageReceived(self, node, message)


class ClearsJournalAfterDump(FollowerSafeSyncObj):  # type: ignore[misc]
    """pysyncobj 0.3.17's own start-up: a node stopped between writing a compaction's dump
    and trimming its journal clears the whole journal, entries after the dump too."""

    def _keep_journal_after_dump(self) -> None:
        pass


class VotesWithAnEmptyDisk(FollowerSafeSyncObj):  # type: ignore[misc]
    """pysyncobj's own voting after a lost disk (cluster/raft_votes.py's rule off, and
    cluster/raft_term_query.py's wait for the current term)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._empty_start.active = False
        self._term_quorum.waiting = False


class StandsWithAPrefix(FollowerSafeSyncObj):  # type: ignore[misc]
    """An empty-started seed that stands for election with part of the log (before
    cluster/raft_votes.py's ``may_stand``); it still votes only for an empty log."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._empty_start.may_stand = lambda last_log_term: True


class LoadsAnOlderDump(FollowerSafeSyncObj):  # type: ignore[misc]
    """The leader's dump before cluster/raft_dump_received.py: put in place of the
    follower's own as soon as it is whole, and loaded unless the follower holds its last
    entry -- a follower that compacted past it went back to it."""

    def _holds_the_dumps_end(self) -> int | None:
        # (imported here: test_raft_dump_older.py runs on the code before it too)
        from cluster.raft_dump_received import read_received, take_received

        serializer = self._SyncObj__serializer
        data = read_received(serializer)
        take_received(serializer)
        last = data[1]
        held = self._SyncObj__getEntries(last[1], 1)
        if held and held[0][2] == last[2]:
            return int(last[1])
        self._peeked_dump = data
        return None


class KeepsItsCatchUpFloor(FollowerSafeSyncObj):  # type: ignore[misc]
    """Never clears the floor of its mismatch answers (cluster/raft_follower.py, _go_back):
    a follower that caught up still answers a mismatch with where it once stood."""

    @property
    def _catch_up_floor(self) -> tuple[int, int] | None:
        return self.__dict__.get("_kept_floor")

    @_catch_up_floor.setter
    def _catch_up_floor(self, floor: tuple[int, int] | None) -> None:
        if floor is not None:
            self.__dict__["_kept_floor"] = floor
