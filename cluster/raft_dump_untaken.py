"""A seed sent the leader's dump again and again that never takes it: the leader says so,
and sends it the dump as 524f73f writes it.

A seed of 524f73f cannot load the dump this version writes (its caches packed:
:mod:`cluster.dump_decoder`). In a rolling upgrade or a downgrade it is sent one when it
falls behind an upgraded leader's compacted log (it was down while the leader
compacted). Its load fails (``failed to load full dump`` ... ``KeyError: 'cached'``),
it answers nothing, pysyncobj's leader takes it back below its log at the next reply
and sends it the whole dump again: ten to twenty-five times a second, for as long as
both ran, that seed never ready, and only its own tracebacks said why: the leader said
nothing (``tests/cluster/test_cluster_mixed_versions.py``).

:class:`UntakenDumps` watches the leader's transmissions: a dump sent whole to a seed
whose match index has not moved since the last one it was sent whole is *untaken*. At
:data:`UNTAKEN` in a row the leader logs a WARNING naming that seed, and from then on
sends it the dump rewritten as 524f73f writes it (:mod:`cluster.raft_dump_old_format`;
this version loads that too), which such a seed loads. If it still takes none, an
ERROR every :data:`REPEAT` seconds (with the count). ``GET /cluster`` of the leader
lists the seeds not taking its dump (``raft_dumps_untaken``: seed -> whole sends not
taken in a row).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from cluster.raft_dump_old_format import OldFormatDump, send_copy

log = logging.getLogger("migratory.raft")

__all__ = ["REPEAT", "UNTAKEN", "UntakenDumps"]

UNTAKEN = 3
"""Whole sends of the dump to one seed, not taken, in a row, before the leader says so."""
REPEAT = 60.0
"""Seconds between two ERRORs about one seed while it goes on not taking the dump."""


@dataclass
class _Sends:
    """A seed's whole sends of the dump in one leader term."""

    term: int
    match: int  # its match index when the last whole send ended
    untaken: int = 0  # whole sends since its match index last moved
    logged_at: float | None = None  # when the last ERROR about it was logged


def _name(node: Any) -> str:
    return str(getattr(node, "address", node))


class UntakenDumps:
    """A leader's whole sends of its dump, per seed. ``syncobj``: the leader (its term,
    its match indexes); ``clock``: seconds, for :data:`REPEAT`."""

    def __init__(self, syncobj: Any, clock: Callable[[], float],
                 old_format: OldFormatDump | None = None) -> None:
        self._syncobj = syncobj
        self._clock = clock
        self._old_format = old_format
        self._sends: dict[Any, _Sends] = {}

    def watch(self, serializer: Any) -> None:
        """Count the transmissions of ``serializer`` (the leader's) that end."""
        original = serializer.getTransmissionData

        def chunk(transmission_id: Any) -> Any:
            if (self._old_format is not None and self._not_taking(transmission_id)
                    and transmission_id not in serializer._Serializer__transmissions):
                copy = self._old_format.open()  # (None until it is made)
                if copy is not None:
                    send_copy(serializer, transmission_id, copy)
            result = original(transmission_id)
            if isinstance(result, tuple) and result[2]:
                self.sent_whole(transmission_id)
            return result

        serializer.getTransmissionData = chunk

    def _not_taking(self, node: Any) -> bool:
        """``node`` has not taken :data:`UNTAKEN` whole sends in a row, in this term."""
        sends = self._sends.get(node)
        return (sends is not None and sends.untaken >= UNTAKEN
                and sends.term == self._syncobj._SyncObj__raftCurrentTerm
                and self._syncobj._SyncObj__raftMatchIndex.get(node, 0) <= sends.match)

    def sent_whole(self, node: Any) -> None:
        """The last chunk of the dump went to ``node``."""
        term = self._syncobj._SyncObj__raftCurrentTerm
        match = self._syncobj._SyncObj__raftMatchIndex.get(node, 0)
        sends = self._sends.get(node)
        if sends is None or sends.term != term or match > sends.match:
            sends = self._sends[node] = _Sends(term=term, match=match)
        sends.untaken += 1
        if sends.untaken < UNTAKEN:
            return
        now = self._clock()
        if sends.logged_at is not None and now - sends.logged_at < REPEAT:
            return
        first = sends.logged_at is None
        sends.logged_at = now
        if first and self._old_format is not None:
            log.warning(
                "Raft: seed %s has been sent this leader's dump %d times in a row and has "
                "not taken it (its match index is still %d): a seed of 524f73f cannot load "
                "this version's dump (its log says 'failed to load full dump' ... KeyError: "
                "'cached'); it is sent the dump rewritten as 524f73f writes it from now on. "
                "Upgrade it (docs/cluster.md, \"Upgrading and downgrading\")",
                _name(node), sends.untaken, match)
            return
        log.error(
            "Raft: seed %s has been sent this leader's dump %d times in a row and has not "
            "taken it (its match index is still %d): it is never ready. A seed that cannot "
            "load this leader's dump (of another version?) -- upgrade it "
            "(docs/cluster.md, \"Upgrading and downgrading\"); nothing is lost meanwhile",
            _name(node), sends.untaken, match)

    def untaken(self) -> dict[str, int]:
        """Seed -> whole sends not taken in a row, of the seeds at :data:`UNTAKEN` or
        more in this leader's term that have not taken one since (a copy: read from the
        trio thread)."""
        term = self._syncobj._SyncObj__raftCurrentTerm
        matches = self._syncobj._SyncObj__raftMatchIndex
        return {_name(node): sends.untaken for node, sends in list(self._sends.items())
                if sends.term == term and sends.untaken >= UNTAKEN
                and matches.get(node, 0) <= sends.match}
