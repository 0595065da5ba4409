"""A Raft dump that cannot be written stops the seed, saying which file and why.

pysyncobj 0.3.17 writes a compaction's dump in a forked child that ends with
``os._exit(-1)`` on any error, and its parent only sees that the child failed: it logs
"Failed to store full dump" -- no file, no reason -- and, its thresholds still passed,
forks the next writer at the next tick. On a full disk (or a directory it cannot write)
a seed forked a writer and logged that line ten times a second, each child pickling the
whole state again and leaving its part-written ``raft.dump.tmp`` to take the space, its
log growing without a compaction until its journal could not grow either (66 forks in
7 s on a single seed; ``tests/cluster/test_raft_dump_files.py``). A follower receiving the
leader's dump logged a traceback ("Failed to write incoming transition data") and
dropped the dump, to be sent it again and fail again.

:func:`stop_on_disk_failures` replaces both, for a dump kept in a file:

- the child writing a dump exits with the ``errno`` of the ``OSError`` that stopped it
  (after removing its part-written file); the parent raises :class:`RaftDiskFailure`
  naming the file, and the seed stops as when its journal cannot be written
  (:mod:`cluster.raft_disk`). Another failure (not the disk's: exit status
  :data:`NOT_A_DISK_FAILURE`, or the child killed) is pysyncobj's "Failed to store full
  dump", tried again, after a line that says what it was;
- a part of the leader's dump that cannot be written, or the dump's rename into place,
  raises :class:`RaftDiskFailure` (the part-written file removed).

What was on the disk stays whole: a dump is written to a temporary file and renamed
into place once synced (:func:`cluster.raft_durability.durable_replace`), so a dump cut
short is never ``raft.dump``, and the journal keeps every entry until a dump holds them.
"""

from __future__ import annotations

import contextlib
import errno as errno_codes
import gzip
import logging
import os
from typing import Any

from pysyncobj import pickle as pysyncobj_pickle
from pysyncobj import serializer as pysyncobj_serializer
from pysyncobj.config import SERIALIZER_STATE

from cluster.raft_disk import RaftDiskFailure

log = logging.getLogger("migratory.raft")

NOT_A_DISK_FAILURE = 255
"""The dump writer's exit status for an error that is not an ``OSError``."""


def _remove(path: str) -> None:
    with contextlib.suppress(OSError):
        os.remove(path)


def write_dump(path: str, data: Any) -> int:
    """Write ``data`` as pysyncobj's dump at ``path`` (in the forked child); the exit
    status: 0, the ``errno`` of the disk's failure, or :data:`NOT_A_DISK_FAILURE`."""
    temporary = path + ".tmp"
    try:
        with open(temporary, "wb") as f, gzip.GzipFile(fileobj=f, mode="wb") as g:
            pysyncobj_pickle.dump(data, g)
        pysyncobj_serializer.atomicReplace(temporary, path)  # (durable_replace)
    except OSError as exc:
        _remove(temporary)
        code = exc.errno or errno_codes.EIO
        return code if 0 < code < NOT_A_DISK_FAILURE else errno_codes.EIO
    except Exception as exc:  # (pysyncobj's "Failed to store full dump" follows)
        log.warning("Raft: the dump could not be written: %s: %s", type(exc).__name__, exc)
        _remove(temporary)
        return NOT_A_DISK_FAILURE
    return 0


def stop_on_disk_failures(serializer: Any) -> None:
    """Replace pysyncobj's writing and receiving of dumps on ``serializer`` (dumps kept
    in a file by pysyncobj's own writer; a forked child, or the Raft thread itself)."""
    path = serializer._Serializer__fileName
    if path is None or serializer._Serializer__serializer is not None:
        return
    forks = serializer._Serializer__useFork
    original_check = serializer.checkSerializing

    def serialize(data: Any, id: Any) -> None:
        if serializer._Serializer__pid != 0:
            return
        serializer._Serializer__currentID = id
        if not forks:  # (the tests' simulated nodes): written here, in this thread
            written = _ended(write_dump(path, data), path)
            serializer._Serializer__pid = -1 if written else -2  # (pysyncobj's marks)
            return
        pid = os.fork()
        if pid == 0:  # the child: whatever happens, it ends here
            code = NOT_A_DISK_FAILURE
            try:
                code = write_dump(path, data)
            finally:
                os._exit(code)
        serializer._Serializer__pid = pid

    def check_serializing() -> tuple[int, Any]:
        pid = serializer._Serializer__pid
        if pid <= 0:  # not writing, or written in this thread: pysyncobj's answer
            state: tuple[int, Any] = original_check()
            return state
        try:
            done, status = os.waitpid(pid, os.WNOHANG)
        except ChildProcessError:
            done, status = pid, NOT_A_DISK_FAILURE << 8
        current = serializer._Serializer__currentID
        if done != pid:
            return SERIALIZER_STATE.SERIALIZING, current
        serializer._Serializer__pid = 0
        if _ended(os.waitstatus_to_exitcode(status), path):
            serializer._Serializer__transmissions = {}
            return SERIALIZER_STATE.SUCCESS, current
        return SERIALIZER_STATE.FAILED, current

    serializer.serialize = serialize
    serializer.checkSerializing = check_serializing
    serializer.setTransmissionData = _receiving(serializer, path)


def _ended(code: int, path: str) -> bool:
    """Whether the dump writer that ended with ``code`` wrote the dump; a disk failure
    raised (pysyncobj's "Failed to store full dump" for anything else)."""
    if code == 0:
        return True
    if 0 < code < NOT_A_DISK_FAILURE:
        raise RaftDiskFailure(path + ".tmp", OSError(code, os.strerror(code)))
    return False


def _receiving(serializer: Any, path: str) -> Any:
    """pysyncobj's ``setTransmissionData`` for a dump file, a disk failure raised."""
    temporary = path + ".1.tmp"
    attribute = "_Serializer__incomingTransmissionFile"

    def receive(data: Any) -> bool:
        if data is None:
            return False
        part, first, last = data
        incoming = getattr(serializer, attribute)
        try:
            if first:
                if incoming is not None:
                    setattr(serializer, attribute, None)
                    incoming.close()
                incoming = open(temporary, "wb")  # noqa: SIM115 (kept across parts)
                setattr(serializer, attribute, incoming)
            elif incoming is None:
                return False  # (its first part was not taken)
            incoming.write(part)
            if not last:
                return False
            setattr(serializer, attribute, None)
            incoming.close()
            pysyncobj_serializer.atomicReplace(temporary, path)  # (durable_replace)
            return True
        except OSError as exc:
            setattr(serializer, attribute, None)
            if incoming is not None:
                with contextlib.suppress(OSError):
                    incoming.close()
            _remove(temporary)
            if isinstance(exc, RaftDiskFailure):
                raise
            raise RaftDiskFailure(temporary, exc) from exc

    return receive
