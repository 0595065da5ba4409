"""A follower answers the AppendEntries it took in one poll after one sync, not one each.

A follower's "I hold up to entry N" goes out only once entry N is on its disk
(:mod:`cluster.raft_durability`). pysyncobj's follower answered each message as it
handled it, so each message that brought entries cost a sync of its own. On a disk
that stalls (1-3 s per ``fdatasync``: docs/cluster.md, "A slow disk"), the messages the
leader sent meanwhile -- one per publish, ``appendEntriesUseBatch`` off -- waited in the
socket, and each, once read, stalled the Raft thread again: the follower fell further
behind with each publish, and with two slow disks of three the leader heard no
acknowledgement from either for seconds.

:class:`HeldAnswers` holds the answers of the AppendEntries handled in one poll, in
their order, and sends them after the poll (pysyncobj reads every message waiting on
every link in one poll) behind one sync of everything they vouch for. Durability is as
before: no answer says "I hold N" before N is on the disk. An answer held is never a
lie when it leaves: where the log is cut (a new leader's conflicting entries), or a dump
replaces it, before the held answers leave, the successes vouching for entries past the
cut are dropped (the leader sends again, as for a lost message). Each carries the term of
the AppendEntries it answers, not the term when it leaves (:mod:`cluster.raft_answer_terms`).
"""

from __future__ import annotations

from typing import Any

from cluster import raft_durability
from cluster.raft_answer_terms import answer

__all__ = ["HeldAnswers"]


class HeldAnswers:
    """Mixed into :class:`cluster.raft_follower.FollowerSafeSyncObj` (before SyncObj)."""

    _SyncObj__raftLog: Any
    _SyncObj__transport: Any
    # node, next, ok, reset, the term of the AppendEntries answered
    _held_answers: list[tuple[Any, int, bool, bool, int]] | None = None

    def _hold_answer(self, node: Any, next_index: int, *, success: bool, term: int,
                     reset: bool = False) -> None:
        """``next_node_idx`` for ``node``, sent by :meth:`_send_held_answers`."""
        if self._held_answers is None:
            self._held_answers = []
        self._held_answers.append((node, next_index, success, reset, term))

    def _send_held_answers(self) -> None:
        """Everything written on the disk (one sync), then the held answers, in order."""
        held = self._held_answers
        if not held:
            return
        raft_durability.journal_durable(self._SyncObj__raftLog)  # before "I hold them"
        self._held_answers = None
        for node, next_index, success, reset, term in held:
            self._SyncObj__transport.send(
                node, answer(next_index, success=success, reset=reset, term=term))

    def _drop_held_past(self, index: int) -> None:
        """Entries from ``index`` on are gone: no held success may vouch for them."""
        if self._held_answers:
            self._held_answers = [
                answer for answer in self._held_answers
                if not answer[2] or answer[1] - 1 < index
            ]

    def _SyncObj__deleteEntriesFrom(self, fromIDx: int) -> None:
        self._drop_held_past(fromIDx)
        super()._SyncObj__deleteEntriesFrom(fromIDx)  # type: ignore[misc]

    def _SyncObj__loadDumpFile(self, clearJournal: bool) -> None:
        self._drop_held_past(0)  # the log is the dump's now
        super()._SyncObj__loadDumpFile(clearJournal)  # type: ignore[misc]

    def _onTick(self, timeToWait: float = 0.0) -> None:
        super()._onTick(timeToWait)  # type: ignore[misc]  # (ends with the poll)
        self._send_held_answers()
