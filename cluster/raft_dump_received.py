"""The leader's dump, once received whole, waits beside this seed's own dump until the
seed loads it; a dump the seed keeps its log against never replaces its own.

pysyncobj 0.3.17's follower renames the last part of a leader's dump over its own dump
file (in memory: replaces its own dump's bytes) before it even reads it. A follower
that then keeps its log -- it holds the dump's last entry, or has applied past it
(:func:`cluster.raft_dump_chunks.held_dump_end`) -- was left with a dump older than its
journal: restarted, pysyncobj found a journal that does not start at the dump, cleared
it and loaded the old dump, dropping every entry after it, entries this seed had
acknowledged (the seed's data-dir check then refused to start: "ends at entry 10, but
entry 16 was committed"); as leader, it sent the old dump and then entries from past its
own log's start, so a follower behind it never caught up
(``tests/cluster/test_raft_dump_older.py``).

:func:`keep_aside` sets a serializer up so (a dump in a file: received as
``raft.dump.1.tmp``, :mod:`cluster.raft_dump_files`; in memory: the bytes held aside);
:func:`read_received` reads it, :func:`take_received` makes it this seed's dump (renamed
into place, synced, before it is loaded), :func:`drop_received` forgets it.
"""

from __future__ import annotations

import contextlib
import gzip
import io
import os
from typing import IO, Any

from pysyncobj import pickle as pysyncobj_pickle
from pysyncobj import serializer as pysyncobj_serializer

from cluster.raft_disk import RaftDiskFailure

__all__ = ["RECEIVED_SUFFIX", "drop_received", "keep_aside", "read_received",
           "take_received"]

RECEIVED_SUFFIX = ".1.tmp"
"""Where a dump file received from the leader waits (pysyncobj's own name for its
part-written file: a seed's start-up removes one left behind, cluster/raft_data_dir.py)."""
_ASIDE = "_received_aside"  # on the serializer: the received bytes (in memory), or None
_MEMORY = "_Serializer__inMemorySerializedData"


def keep_aside(serializer: Any) -> None:
    """A dump received whole on ``serializer`` (pysyncobj's) waits for
    :func:`take_received`. In a file, :func:`cluster.raft_dump_files.stop_on_disk_failures`
    (called first) receives it so; in memory, this wraps ``setTransmissionData``."""
    if serializer._Serializer__fileName is not None:
        if serializer._Serializer__serializer is not None:  # (raft_dump_files.py's rule)
            raise ValueError("a custom dump serializer receives in place of the own dump")
        return
    original = serializer.setTransmissionData

    def receive(data: Any) -> bool:
        own = getattr(serializer, _MEMORY)
        whole = bool(original(data))
        if whole:  # pysyncobj put it in place of this seed's own: held aside instead
            setattr(serializer, _ASIDE, getattr(serializer, _MEMORY))
            setattr(serializer, _MEMORY, own)
        return whole

    serializer.setTransmissionData = receive
    setattr(serializer, _ASIDE, None)


def _received_file(serializer: Any) -> str:
    return str(serializer._Serializer__fileName) + RECEIVED_SUFFIX


def read_received(serializer: Any) -> Any:
    """The dump last received whole, read as pysyncobj reads a dump (any error raised)."""
    if serializer._Serializer__fileName is None:
        source: IO[bytes] = io.BytesIO(getattr(serializer, _ASIDE))
    else:
        source = open(_received_file(serializer), "rb")  # noqa: SIM115 (closed below)
    with source, gzip.GzipFile(fileobj=source) as g:
        return pysyncobj_pickle.load(g)


def take_received(serializer: Any) -> None:
    """The received dump is this seed's dump from now on (on the disk before it is
    loaded: a seed killed in between restarts from it)."""
    path = serializer._Serializer__fileName
    if path is None:
        setattr(serializer, _MEMORY, getattr(serializer, _ASIDE))
        setattr(serializer, _ASIDE, None)
        return
    try:
        pysyncobj_serializer.atomicReplace(_received_file(serializer), path)  # (durable)
    except OSError as exc:
        if isinstance(exc, RaftDiskFailure):
            raise
        raise RaftDiskFailure(path, exc) from exc


def drop_received(serializer: Any) -> None:
    """Forget the received dump: this seed's own stays its dump."""
    if serializer._Serializer__fileName is None:
        setattr(serializer, _ASIDE, None)
        return
    with contextlib.suppress(OSError):
        os.remove(_received_file(serializer))
