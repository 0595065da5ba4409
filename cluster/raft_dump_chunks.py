"""The leader's dump in chunks: the chunk that ends the file is the last one (pysyncobj
0.3.17 marks only an extra, empty chunk so); and a follower that holds where the dump
ends, or has applied past it, keeps its log instead of loading it."""

from __future__ import annotations

import logging
from typing import Any

from cluster.raft_dump_files import DumpRetries, stop_on_disk_failures
from cluster.raft_dump_received import drop_received, keep_aside, read_received, take_received

__all__ = ["UNREADABLE", "dumps_sent_and_received", "held_dump_end", "mark_the_last_chunk"]

log = logging.getLogger("migratory.raft")

UNREADABLE = -1
"""What :func:`held_dump_end` says of a dump it cannot read."""


def dumps_sent_and_received(serializer: Any, retries: DumpRetries) -> None:
    """Set up a seed's ``serializer`` (pysyncobj's): the chunk that ends a dump is the
    last (:func:`mark_the_last_chunk`), a dump that cannot be written or received stops
    the seed (:func:`cluster.raft_dump_files.stop_on_disk_failures`), and a dump received
    whole waits until it is loaded (:func:`cluster.raft_dump_received.keep_aside`)."""
    mark_the_last_chunk(serializer)
    stop_on_disk_failures(serializer, retries)
    keep_aside(serializer)


def held_dump_end(node: Any) -> int | None:
    """What ``node`` vouches for when it keeps its log against the leader's dump just
    received whole: the index of the dump's last entry when its log holds that entry
    (same index, same term: Raft, InstallSnapshot: "if existing log entry has same index
    and term as snapshot's last included entry, retain log entries following it and
    reply"); its last applied index when the dump ends before its log begins (it
    compacted past the dump: its state holds the dump's, and more).

    pysyncobj's leader sends its dump whenever its next index for a follower falls below
    its log, and it rewinds that index on some replies and reconnections, so an
    up-to-date follower is sent a dump older than what it holds. Loading it dropped
    every entry after the dump, entries this follower had acknowledged: if the leader
    then died, a seed without a committed entry could be elected, and its position was
    given to another message (chaos seed 15 with compaction every 3 s: "raftCommitIndex
    (6094) exceeds journal end (5922) after loading dump";
    ``tests/cluster/test_raft_dump_kept_tail.py``). A follower that had compacted past
    the dump went back further: its state and applied index to the dump's, its log to
    the dump's last two entries -- and its own compaction, finishing at its next tick,
    then trimmed that log to nothing (every later tick failed on the empty log;
    ``tests/cluster/test_raft_dump_older.py``).

    None: load the dump (renamed into place as this node's dump, and read once: kept in
    ``node._peeked_dump`` for the load); :data:`UNREADABLE`: it could not be read. A
    dump kept against, or unreadable, is dropped: the node's own dump stays
    (:mod:`cluster.raft_dump_received`).
    """
    serializer = node._SyncObj__serializer
    try:
        data = read_received(serializer)
    except Exception:
        log.exception("failed to load full dump")  # (pysyncobj's words for it)
        drop_received(serializer)
        return UNREADABLE
    last = data[1]  # (command, index, term)
    first = node._SyncObj__raftLog[0][1]
    applied = node._SyncObj__raftLastApplied
    held = node._SyncObj__getEntries(last[1], 1)
    if last[1] < first and last[1] <= applied:
        log.info("Raft: the leader's dump ends at %d, before this seed's log (from %d, "
                 "applied up to %d): its state holds the dump's; kept its log",
                 last[1], first, applied)
        drop_received(serializer)
        return int(applied)
    if not held or held[0][2] != last[2]:
        take_received(serializer)
        node._peeked_dump = data
        return None
    log.info("Raft: the leader's dump ends at %d, which this seed holds (its log goes to "
             "%d): kept its log", last[1], node._SyncObj__getCurrentLogIndex())
    drop_received(serializer)
    return int(last[1])


def mark_the_last_chunk(serializer: Any) -> None:
    """The dump chunk that reaches the end of the file says so (``isLast``).

    pysyncobj 0.3.17 sends a follower the leader's dump in chunks and marks only an
    extra, empty chunk as the last one: an extra round of ``__sendAppendEntries`` when
    the round's time budget ran out after the data. In that round the leader may be
    writing a dump of its own (then no chunk goes out), and once that dump is written
    every transmission restarts from its first chunk. A leader that compacts often (under
    load, or the chaos runner's 2,000 entries) then sent a deposed seed the whole dump
    again and again and never the empty last chunk: the seed never caught up, kept
    starting elections, and the cluster committed about one batch a second (seen in
    chaos runs, seed 4; ``tests/cluster/test_raft_dump_chunks.py``). Here the chunk that
    ends the file is the last one, so a dump smaller than a round's budget arrives whole
    in one round.
    """
    original = serializer.getTransmissionData
    size = serializer._Serializer__transmissionBatchSize

    def chunk(transmission_id: Any) -> Any:
        result = original(transmission_id)
        if not isinstance(result, tuple):
            return result
        data, first, last = result
        if last or len(data) >= size:
            return result
        ended = serializer._Serializer__transmissions.pop(transmission_id, None)
        if ended is not None and "file" in ended:
            ended["file"].close()
        return data, first, True

    serializer.getTransmissionData = chunk
