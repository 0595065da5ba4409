"""A submitted command's callback is answered when its entry leaves the log unapplied.

pysyncobj 0.3.17 keeps the callback of a command submitted on this node by the log index
the leader gave it (``__commandsWaitingCommit``: index -> [(term, callback)]) and answers
it only when that index is applied here: SUCCESS if the entry there has the callback's
term, DISCARDED if not. An entry that is never applied here leaves its callback waiting:

- a follower truncates its log at a conflict with its leader's (a deposed leader's tail,
  :meth:`~cluster.raft_follower.FollowerSafeSyncObj._merge`): the index is applied only
  once the new leader's log grows back to it -- never, when nothing more is submitted;
- a follower loads its leader's dump: the indices the dump covers are never applied one
  by one (and those after it were cleared with the journal);
- a follower forwarded a command, the leader answered its index and changed before the
  follower got the entry (lost in flight, or never sent): the old leader will not send
  it, the next one's log need never reach that index. pysyncobj answers LEADER_CHANGED
  at a leader change only to the commands still waiting for the leader's answer;
- a follower forwarded a command and the link to the leader broke with the leader's
  answer in flight: the leader, still leading, never sends it again. Those still waiting
  for an answer are answered when the link to the leader breaks (a forward not written
  yet is held, ``cluster/raft_forward.py``, and sent again on the next link).

A seed's callback releases a commit-window slot, sets the event a non-seed's forwards
wait for and settles the publishes' outcome (``cluster/seed.py``): left waiting, they
waited until the window reclaimed the slot and the publish timed out; the three-seed dump
benchmark, which waits for every callback, waited for ever in its commit phase
(``benchmarks/raft_leader_dump_election.py``; ``tests/cluster/test_raft_orphaned_callbacks.py``).

Such a callback is answered at once with ``UNKNOWN_OUTCOME``, not DISCARDED: an entry a
follower truncated may still be committed by a later leader that holds it (the Raft
paper's figure 8), and one a dump covers may have committed. The seed settles an unknown
outcome with a barrier (``cluster/raft_outcomes.py``). Truncated or covered, only the
callbacks whose entry this node held are answered: one waiting for an index this
follower has not received yet (a command it forwarded) waits for it from the same
leader, as before -- until the leader changes.

The work is proportional to the callbacks waiting (the commands in flight), never to
the log.
"""

from __future__ import annotations

from typing import Any

from pysyncobj import FAIL_REASON, SyncObj

__all__ = ["AnswersLostEntries"]


class AnswersLostEntries(SyncObj):  # type: ignore[misc]
    """``SyncObj`` answering the callbacks of entries truncated or covered by a dump."""

    _SyncObj__commandsWaitingCommit: Any
    _SyncObj__commandsWaitingReply: dict[Any, Any]
    _SyncObj__raftLastApplied: int
    _SyncObj__raftLeader: Any

    def _held_terms(self, first: int) -> dict[int, int]:
        """The term of the entry this node holds at each index >= ``first`` a callback
        waits for."""
        held: dict[int, int] = {}
        for index in [i for i in self._SyncObj__commandsWaitingCommit if i >= first]:
            entries = self._SyncObj__getEntries(index, 1)
            if entries and entries[0][1] == index:
                held[index] = entries[0][2]
        return held

    def _answer_lost(self, held: dict[int, int], *, up_to: int = -1) -> None:
        """Answer (UNKNOWN_OUTCOME) every callback waiting at an index <= ``up_to``, and
        those waiting at an index of ``held`` with the term it maps it to."""
        waiting = self._SyncObj__commandsWaitingCommit
        lost: list[Any] = []
        for index in sorted(i for i in waiting if i <= up_to or i in held):
            kept = []
            for term, callback in waiting.pop(index):
                if index <= up_to or term == held[index]:
                    lost.append(callback)
                else:
                    kept.append((term, callback))
            if kept:
                waiting[index] = kept
        for callback in lost:
            callback(None, FAIL_REASON.UNKNOWN_OUTCOME)

    def _SyncObj__deleteEntriesFrom(self, fromIDx: int) -> None:
        held = self._held_terms(fromIDx)
        SyncObj._SyncObj__deleteEntriesFrom(self, fromIDx)
        self._answer_lost(held)

    def _SyncObj__onLeaderChanged(self) -> None:
        """pysyncobj answers LEADER_CHANGED to the commands still waiting for the old
        leader's reply; here also those it answered whose entry this node does not hold:
        the old leader will not send it, and the next one's log need never reach it."""
        SyncObj._SyncObj__onLeaderChanged(self)
        waiting = self._SyncObj__commandsWaitingCommit
        unheld = {}
        for index in list(waiting):
            entries = self._SyncObj__getEntries(index, 1)
            held = entries[0][2] if entries and entries[0][1] == index else None
            if any(term != held for term, _ in waiting[index]):
                unheld[index] = held
        for index, held in unheld.items():
            lost = [callback for term, callback in waiting[index] if term != held]
            kept = [(term, callback) for term, callback in waiting.pop(index) if term == held]
            if kept:
                waiting[index] = kept
            for callback in lost:
                callback(None, FAIL_REASON.UNKNOWN_OUTCOME)

    def _SyncObj__onNodeDisconnected(self, node: Any) -> None:
        """The link to the leader broke: an answer to a forwarded command in flight on it
        is lost, and the leader, still leading, never sends it again (pysyncobj waited
        for it until the next leader change)."""
        SyncObj._SyncObj__onNodeDisconnected(self, node)
        waiting = self._SyncObj__commandsWaitingReply
        if node != self._SyncObj__raftLeader or not waiting:
            return
        self._SyncObj__commandsWaitingReply = {}
        for request in sorted(waiting):
            waiting[request](None, FAIL_REASON.UNKNOWN_OUTCOME)

    def _SyncObj__loadDumpFile(self, clearJournal: bool) -> None:
        held = self._held_terms(self._SyncObj__raftLastApplied + 1)
        super()._SyncObj__loadDumpFile(clearJournal)
        gone = {i: t for i, t in held.items() if not _still_held(self, i, t)}
        self._answer_lost(gone, up_to=self._SyncObj__raftLastApplied)


def _still_held(node: Any, index: int, term: int) -> bool:
    entries = node._SyncObj__getEntries(index, 1)
    return bool(entries) and entries[0][1] == index and entries[0][2] == term
