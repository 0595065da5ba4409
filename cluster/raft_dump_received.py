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

A seed that takes the leader's dump while its own compaction's writer (pysyncobj's forked
child) still runs gives that writer up: finishing after, it renamed its dump, older than
the leader's, over it, and the seed's next start found a journal that did not start at
its dump (pysyncobj clears such a journal; the data-dir check refuses it).
"""

from __future__ import annotations

import contextlib
import gzip
import io
import logging
import os
import signal
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

log = logging.getLogger("migratory.raft")


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
    loaded: a seed killed in between restarts from it). A dump of its own still being
    written is given up first: written after, it replaced this one with an older state
    than the journal after the load (``test_raft_dump_received.py``)."""
    path = serializer._Serializer__fileName
    if path is None:
        setattr(serializer, _MEMORY, getattr(serializer, _ASIDE))
        setattr(serializer, _ASIDE, None)
        return
    _stop_own_writer(serializer, path)
    try:
        pysyncobj_serializer.atomicReplace(_received_file(serializer), path)  # (durable)
    except OSError as exc:
        if isinstance(exc, RaftDiskFailure):
            raise
        raise RaftDiskFailure(path, exc) from exc


def _stop_own_writer(serializer: Any, path: str) -> None:
    """Kill the forked child writing this seed's own dump, if one runs (pysyncobj's
    ``__pid`` > 0), and forget it: pysyncobj then trims no journal for it."""
    pid = serializer._Serializer__pid
    if pid <= 0:
        return
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGKILL)
    with contextlib.suppress(ChildProcessError):
        os.waitpid(pid, 0)
    serializer._Serializer__pid = 0
    with contextlib.suppress(OSError):
        os.remove(path + ".tmp")  # (its part-written dump)
    log.warning("Raft: this seed's own dump (compaction) was still being written when the "
                "leader's dump came to replace it: given up")


def drop_received(serializer: Any) -> None:
    """Forget the received dump: this seed's own stays its dump."""
    if serializer._Serializer__fileName is None:
        setattr(serializer, _ASIDE, None)
        return
    with contextlib.suppress(OSError):
        os.remove(_received_file(serializer))
