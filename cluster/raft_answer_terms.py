"""A follower's answer carries the term of the AppendEntries it answers; a leader drops one
from an earlier term.

pysyncobj 0.3.17's follower answers AppendEntries with ``next_node_idx`` (its next index,
``reset``, ``success``) and no term, and its leader raises its match index for the
follower on any success higher than it holds. Raft (§5.1) drops a reply whose term is
older than the current one, and the paper's Figure 8 (§5.4.2) is why: a success sent in
term T that reaches the same node after it lost its leadership and won again in a later
term (a link that stalled across two elections, or answers waiting behind a stalled
disk: docs/cluster.md, "A slow disk") vouches for entries of T the follower may no longer
hold, and the leader's log may not hold either. On the Raft simulation, 5 nodes: B took
A's three entries of term 1 and answered "I hold up to 6" into a stalled link; M, elected
in term 2, replaced them on every node with its no-op at 4; A, elected in term 3, took B's
old answer (match index 0 -> 6, B holding up to 4), and committed its command at 6 held by
A and one other node -- 2 of 5; with those two down the others elected a leader that
committed its no-op at 6 over it (``tests/cluster/test_raft_answer_terms.py``).

Here every answer the follower sends carries ``term``, the term of the AppendEntries it
answers (a held answer leaves after its disk sync, maybe in a later term: it keeps the
one it was written in, :mod:`cluster.raft_held_answers`). A leader takes an answer of an
earlier term as neither a success nor a reset: still heard (pysyncobj's leader counts it
as a response), but it answers no AppendEntries of this leadership, so it is not counted
among them (:mod:`cluster.raft_stale_answers`). An answer without ``term`` (a member of an
earlier version) is taken as before; a member of an earlier version ignores the key (its
pysyncobj reads only the keys it knows).
"""

from __future__ import annotations

from typing import Any

__all__ = ["AnswersOfTheirTerm", "answer"]


def answer(next_index: int, *, success: bool, reset: bool, term: int) -> dict[str, Any]:
    """pysyncobj's ``next_node_idx`` answer, with the term of the AppendEntries answered."""
    return {"type": "next_node_idx", "next_node_idx": next_index, "reset": reset,
            "success": success, "term": term}


class AnswersOfTheirTerm:
    """Mixed into :class:`cluster.raft_follower.FollowerSafeSyncObj`, before
    :class:`~cluster.raft_stale_answers.StaleAnswersAfterADump` (whose counts an answer of
    an earlier term stays out of)."""

    _SyncObj__raftCurrentTerm: int
    _SyncObj__transport: Any
    _SyncObj__getCurrentLogIndex: Any

    def _send_answer(self, node: Any, next_index: int | None, *, success: bool,
                     term: int) -> None:
        """A success (from the leader's dump), sent now; ``next_index`` None: past the log."""
        if next_index is None:
            next_index = self._SyncObj__getCurrentLogIndex() + 1
        self._SyncObj__transport.send(
            node, answer(next_index, success=success, reset=False, term=term))

    def _answer_heard(self, node: Any, message: dict[str, Any]) -> dict[str, Any]:
        """``message``, but an answer from an earlier term without its success or reset."""
        term = message.get("term")
        if (message.get("type") == "next_node_idx" and isinstance(term, int)
                and term < self._SyncObj__raftCurrentTerm):
            return {**message, "success": False, "reset": False}
        return super()._answer_heard(node, message)  # type: ignore[misc,no-any-return]
