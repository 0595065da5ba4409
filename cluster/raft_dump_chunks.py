"""The leader's side of sending its Raft dump in chunks: the chunk that ends the file is
the last one (pysyncobj 0.3.17 marks only an extra, empty chunk so)."""

from __future__ import annotations

from typing import Any

__all__ = ["mark_the_last_chunk"]


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
