"""A leader sends a follower its dump once, not once for each answer already on its way.

pysyncobj 0.3.17's leader takes every ``next_node_idx`` answer with ``reset`` as the
follower's next index, whatever it has sent since. A follower behind the leader's log
(it was down, cut off, or its disk stalled) answers *each* AppendEntries waiting for it
with the same "reset to my log's end" -- one per heartbeat round it missed. The first
makes the leader send its whole dump, and set the next index past the dump; each later
one, sent by the follower before the dump reached it, then rewinds the next index below
the leader's log again, and the leader sends its whole dump again: on the Raft
simulation, a follower whose answers arrive one a round with 3 AppendEntries in flight
was sent the dump 3 times (``tests/cluster/test_raft_stale_answers.py``). The follower
keeps its log against the later copies (:func:`cluster.raft_dump_chunks.held_dump_end`),
so nothing is lost, but each copy is a whole cache, sent to a follower already catching
up. Such an answer never lowers the leader's match index (pysyncobj only raises it) and
counts towards no commit.

:class:`StaleAnswersAfterADump` counts, per follower and link, the AppendEntries sent
and the answers heard. When the last part of a dump goes to a follower, the answers it
still owes are those of AppendEntries sent before that part (a link delivers in order):
a reset among them that would send the dump again loses its reset (it is still heard:
pysyncobj's leader counts it as a response), as the answer to a message the dump has
overtaken. Every other answer goes to pysyncobj as before, and so does every answer after
the owed ones -- the follower's word once it has the dump, or its reset if it could not
take it, so a dump not taken is sent again at once. Only AppendEntries sent whole are
counted (the follower answers each exactly once; a large entry's parts get one answer
for several): where the count is off, fewer answers lose their reset, as before.
"""

from __future__ import annotations

from typing import Any

from pysyncobj import SyncObj
from pysyncobj.syncobj import _RAFT_STATE

__all__ = ["StaleAnswersAfterADump"]


class StaleAnswersAfterADump:
    """Mixed into :class:`cluster.raft_follower.FollowerSafeSyncObj` (before SyncObj)."""

    _SyncObj__raftLog: Any
    _SyncObj__raftState: int
    _SyncObj__transport: Any
    # per follower, on its current link while this node leads: AppendEntries sent whole,
    # answers heard, answers still owed for AppendEntries sent before its last dump
    _answers_owed: dict[Any, list[int]] | None = None

    def _owed(self, node: Any) -> list[int]:
        if self._answers_owed is None:
            self._answers_owed = {}
        return self._answers_owed.setdefault(node, [0, 0, 0])

    def _SyncObj__sendAppendEntries(self) -> None:
        transport = self._SyncObj__transport
        send = transport.send

        def counted(node: Any, message: dict[str, Any]) -> Any:
            sent = send(node, message)
            if "prevLogIdx" in message and "transmission" not in message:
                self._owed(node)[0] += 1
            serialized = message.get("serialized")
            if serialized is not None and serialized[2]:  # the dump's last part
                owed = self._owed(node)
                owed[2] = owed[0] - owed[1]
            return sent

        own = transport.__dict__.get("send")  # (one set on the instance, if any)
        transport.send = counted
        try:
            SyncObj._SyncObj__sendAppendEntries(self)
        finally:
            if own is None:
                del transport.send  # (the class's again)
            else:
                transport.send = own

    def _answer_heard(self, node: Any, message: dict[str, Any]) -> dict[str, Any]:
        """``message``, or, for a reset answering an AppendEntries sent before the dump
        that went to ``node`` since and that would send that dump again, the same answer
        without its reset (still heard: pysyncobj's leader counts it as a response)."""
        if (message.get("type") != "next_node_idx"
                or self._SyncObj__raftState != _RAFT_STATE.LEADER):
            return message
        owed = self._owed(node)
        owed[1] += 1
        if owed[2] <= 0:
            return message
        owed[2] -= 1
        if message["reset"] and message["next_node_idx"] <= self._SyncObj__raftLog[0][1]:
            return {**message, "reset": False}
        return message

    def _SyncObj__onNodeDisconnected(self, node: Any) -> None:
        if self._answers_owed is not None:  # a new link owes nothing
            self._answers_owed.pop(node, None)
        super()._SyncObj__onNodeDisconnected(node)  # type: ignore[misc]

    def _SyncObj__onBecomeLeader(self) -> None:
        self._answers_owed = {}
        SyncObj._SyncObj__onBecomeLeader(self)
