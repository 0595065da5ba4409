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
  (:mod:`cluster.raft_disk`);
- another failure (not the disk's: exit status :data:`NOT_A_DISK_FAILURE`, or the child
  killed) is a bug -- typically an attribute of the node that cannot be pickled: pysyncobj
  pickles every attribute set after its ``__init__`` -- or the writer killed (out of
  memory). pysyncobj tried again at the next tick, for ever, each try pickling the whole
  state again, with two lines each ("Failed to store full dump"). Now the first failure
  logs its traceback at ERROR (from the writer, which has it), and :class:`DumpRetries`
  puts the next try off 1, 2, 4 ... up to :data:`BACKOFF_MAX` seconds, each failure one
  WARNING with its count, and one line once a dump is written again. The seed keeps
  running meanwhile: the same code fails the same way on every seed, and stopping them
  would stop the cluster, while running on only grows the log and its journal
  (docs/cluster.md, "A dump that fails, not for the disk"); ``DumpRetries.total`` is
  in ``GET /cluster`` (``raft_dump_failures``) and ``/metrics``
  (``migratory_raft_dump_failures_total``);
- a part of the leader's dump that cannot be written raises :class:`RaftDiskFailure`
  (the part-written file removed); the dump received whole waits beside this seed's own
  until the seed loads it (:mod:`cluster.raft_dump_received`).

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
import pickle
import signal
from typing import Any

from pysyncobj import serializer as pysyncobj_serializer
from pysyncobj import syncobj as pysyncobj_syncobj
from pysyncobj.config import SERIALIZER_STATE

from cluster.raft_disk import RaftDiskFailure

log = logging.getLogger("migratory.raft")

DUMP_PROTOCOL = 4
"""The pickle protocol of the dumps a seed writes. pysyncobj writes protocol 2, in which a
``bytes`` is a call to ``_codecs.encode`` with its bytes as UTF-8 text (1.5 bytes per
random byte): a seed loading a dump of 660,000 cached 100-byte messages spent ~1 s of
its Raft thread unpickling them (docs/benchmarks.md, "Loading a Raft dump"). Protocol 4
writes a ``bytes`` as bytes. Any protocol loads the same (``pickle.load`` reads it from
the dump), so a seed of the code before takes such a dump, and this one takes theirs."""
NOT_A_DISK_FAILURE = 255
"""The dump writer's exit status for an error that is not an ``OSError``."""
BACKOFF_FIRST = 1.0
BACKOFF_MAX = 60.0
"""Seconds before the next try after a dump failed, not for the disk: doubled from
:data:`BACKOFF_FIRST` at each failure in a row, up to this."""


class DumpRetries:
    """Dumps that failed in a row, not for the disk: when the next may be tried.

    Kept on the node, set before ``SyncObj.__init__`` (so not in its dumps); read by the
    trio thread only as ``total`` (an int)."""

    def __init__(self) -> None:
        self.in_a_row = 0
        self.total = 0
        """Every dump that failed, not for the disk, since the seed started."""
        self.next_try = 0.0
        self._since = 0.0

    def may_try(self, now: float) -> bool:
        return now >= self.next_try

    def failed(self, now: float, why: str, path: str) -> None:
        """Count one failure (logged, with when the next try comes)."""
        if self.in_a_row == 0:
            self._since = now
        self.in_a_row += 1
        self.total += 1
        delay = min(BACKOFF_FIRST * 2 ** (self.in_a_row - 1), BACKOFF_MAX)
        self.next_try = now + delay
        log.warning(
            "Raft: the dump (log compaction) failed, %d in a row over %.0f s: %s; "
            "next try in %g s. The Raft log is not compacted meanwhile: %s and this "
            "seed's memory grow", self.in_a_row, now - self._since, why, delay,
            os.path.join(os.path.dirname(path), "raft.journal"),
        )

    def written(self, now: float) -> None:
        if self.in_a_row:
            log.warning("Raft: the dump (log compaction) was written again after %d "
                        "failures over %.0f s", self.in_a_row, now - self._since)
        self.in_a_row = 0
        self.next_try = 0.0


def _clock() -> float:
    return float(pysyncobj_syncobj.monotonicTime())  # the Raft clock (simulated in tests)


def _why(code: int) -> str:
    """Why a dump writer that ended with ``code`` (not 0, not a disk's errno) failed."""
    if code < 0:
        name = signal.Signals(-code).name if -code in signal.valid_signals() else -code
        return f"its writer was killed by signal {name} (out of memory?)"
    return "not a disk failure but a bug (its traceback logged at the first failure)"


def _remove(path: str) -> None:
    with contextlib.suppress(OSError):
        os.remove(path)


def write_dump(path: str, data: Any, *, first: bool = True) -> int:
    """Write ``data`` as pysyncobj's dump at ``path`` (in the forked child); the exit
    status: 0, the ``errno`` of the disk's failure, or :data:`NOT_A_DISK_FAILURE`
    (its traceback logged if it is the ``first`` such failure in a row)."""
    temporary = path + ".tmp"
    try:
        with open(temporary, "wb") as f, gzip.GzipFile(fileobj=f, mode="wb") as g:
            pickle.dump(data, g, DUMP_PROTOCOL)
        pysyncobj_serializer.atomicReplace(temporary, path)  # (durable_replace)
    except OSError as exc:
        _remove(temporary)
        code = exc.errno or errno_codes.EIO
        return code if 0 < code < NOT_A_DISK_FAILURE else errno_codes.EIO
    except Exception as exc:  # a bug: said here, where its traceback is; DumpRetries next
        if first:
            log.error(
                "Raft: the dump (log compaction) could not be written, not for the disk: a "
                "bug (%s: %s). This seed runs on and tries again, less and less often (up "
                "to every %g s); its Raft log is not compacted until a dump is written",
                type(exc).__name__, exc, BACKOFF_MAX, exc_info=True,
            )
        _remove(temporary)
        return NOT_A_DISK_FAILURE
    return 0


def stop_on_disk_failures(serializer: Any, retries: DumpRetries | None = None) -> None:
    """Replace pysyncobj's writing and receiving of dumps on ``serializer`` (dumps kept
    in a file by pysyncobj's own writer; a forked child, or the Raft thread itself);
    ``retries``: the node's, counting the failures that are not the disk's."""
    path = serializer._Serializer__fileName
    if path is None or serializer._Serializer__serializer is not None:
        return
    forks = serializer._Serializer__useFork
    original_check = serializer.checkSerializing
    if retries is None:
        retries = DumpRetries()

    def serialize(data: Any, id: Any) -> None:
        if serializer._Serializer__pid != 0 or not retries.may_try(_clock()):
            return  # (pysyncobj asks again at its next tick)
        serializer._Serializer__currentID = id
        first = retries.in_a_row == 0
        if not forks:  # (the tests' simulated nodes): written here, in this thread
            code = write_dump(path, data, first=first)
            written = _ended(code, path)
            if written:
                retries.written(_clock())
            else:
                retries.failed(_clock(), _why(code), path)
            serializer._Serializer__pid = -1 if written else 0  # (pysyncobj's mark)
            return
        pid = os.fork()
        if pid == 0:  # the child: whatever happens, it ends here
            code = NOT_A_DISK_FAILURE
            try:
                code = write_dump(path, data, first=first)
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
        code = os.waitstatus_to_exitcode(status)
        if _ended(code, path):
            retries.written(_clock())
            serializer._Serializer__transmissions = {}
            return SERIALIZER_STATE.SUCCESS, current
        retries.failed(_clock(), _why(code), path)
        # not FAILED: pysyncobj's "Failed to store full dump" says nothing more
        return SERIALIZER_STATE.NOT_SERIALIZING, None

    serializer.serialize = serialize
    serializer.checkSerializing = check_serializing
    serializer.setTransmissionData = _receiving(serializer, path)


def _ended(code: int, path: str) -> bool:
    """Whether the dump writer that ended with ``code`` wrote the dump; a disk failure
    raised (:class:`DumpRetries` for anything else)."""
    if code == 0:
        return True
    if 0 < code < NOT_A_DISK_FAILURE:
        raise RaftDiskFailure(path + ".tmp", OSError(code, os.strerror(code)))
    return False


def _receiving(serializer: Any, path: str) -> Any:
    """pysyncobj's ``setTransmissionData`` for a dump file, a disk failure raised; the
    dump received whole stays beside this seed's own (``raft.dump.1.tmp``) until
    :func:`cluster.raft_dump_received.take_received` renames it into place."""
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
            incoming.close()  # whole: it waits there (cluster/raft_dump_received.py)
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
