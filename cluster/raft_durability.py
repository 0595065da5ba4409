"""What a seed acknowledges or votes is on its disk first, power loss included.

pysyncobj 0.3.17 never calls ``fsync``: it writes its journal through ``mmap``, its term
and vote to a file it renames into place, and its dumps to a file it renames too. A seed
killed by SIGKILL keeps all of it (the kernel's page cache outlives the process), but a
machine that loses power keeps only what had reached the disk. A follower then answered
"I hold entry N" for an entry still in memory: with two of three seeds' machines losing
power at once (one rack, one zone, one hypervisor), the cluster could come back without
a publication it had acknowledged -- and give its position to another message -- or
with a seed that voted twice in one term.

Here, as Raft requires of "persistent state" (paper, Figure 2: updated on stable storage
before responding to RPCs):

- a follower's log is on the disk before it answers an AppendEntries with success, and a
  leader's own entries are before it counts itself towards a commit (each tick that
  follows a write begins with :func:`journal_durable`: one ``fdatasync`` for every entry
  written since the last one, and none when nothing was);
- the term and vote are on the disk before the vote is granted: the file is synced,
  renamed into place, and its directory synced (:func:`_durable_store_meta`);
- a dump -- written by the seed at a compaction, or received from the leader -- is
  synced before it is renamed into place, and its directory after, so the journal
  entries it replaces are dropped only once it is on the disk (:func:`durable_replace`);
- a file created in ``ClusterDataDir`` (the journal, a compaction's trimmed journal, the
  empty-start marker) is named in its synced directory.

``fdatasync`` releases the GIL, so the trio thread does not wait for the disk; ``msync``
(``mmap.flush``) would not. On this machine one costs ~0.1-0.4 ms, +0.8 ms on the
median acknowledgement (docs/benchmarks.md, "Raft on the disk: what the syncs cost").
``tests/cluster/test_raft_power_loss.py`` drives real pysyncobj nodes through power
losses that keep only what was synced. Every sync is timed (:func:`synced_file`,
:func:`synced_directory`): a slow disk is said once per episode
(:mod:`cluster.raft_slow_disk`).
"""

from __future__ import annotations

import errno
import functools
import os
from collections.abc import Callable
from typing import Any

from pysyncobj import journal as pysyncobj_journal
from pysyncobj import serializer as pysyncobj_serializer

from cluster import raft_slow_disk
from cluster.raft_disk import RaftDiskFailure

DIRECTORY_SYNC_UNSUPPORTED = (errno.EINVAL, errno.EOPNOTSUPP, errno.ENOTSUP)
PENDING = "_migratory_unsynced"  # set on a ResizableFile written since its last sync


def sync_file(fd: int) -> None:
    """The file's data on the disk (the tests replace this to model a power loss)."""
    os.fdatasync(fd)


def sync_directory(path: str) -> None:
    """The names in directory ``path`` on the disk (creations, renames, removals).

    A file system that cannot sync a directory (EINVAL, EOPNOTSUPP: some network and
    FUSE file systems) is let be, as PostgreSQL does: it orders names by itself or not
    at all, and refusing to run there would be worse."""
    fd = os.open(path or ".", os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    except OSError as exc:
        if exc.errno not in DIRECTORY_SYNC_UNSUPPORTED:
            raise
    finally:
        os.close(fd)


def synced_file(fd: int, path: str) -> None:
    """:func:`sync_file` of ``path``'s ``fd``, timed (a slow disk is said once per
    episode: :mod:`cluster.raft_slow_disk`)."""
    raft_slow_disk.SYNCS.timed(path, lambda: sync_file(fd))


def synced_directory(path: str) -> None:
    """:func:`sync_directory`, timed (:mod:`cluster.raft_slow_disk`)."""
    raft_slow_disk.SYNCS.timed(path or ".", lambda: sync_directory(path))


def _file_of(journal: Any) -> Any:
    return getattr(journal, "_FileJournal__journalFile", None)


def journal_durable(journal: Any) -> None:
    """Everything written to pysyncobj's ``journal`` so far on the disk (nothing to do
    for an in-memory journal, or when nothing was written since the last call)."""
    mapped = _file_of(journal)
    if mapped is None or not getattr(mapped, PENDING, False):
        return
    try:
        synced_file(mapped._ResizableFile__f.fileno(), mapped._ResizableFile__fileName)
    except OSError as exc:
        raise RaftDiskFailure(mapped._ResizableFile__fileName, exc) from exc
    setattr(mapped, PENDING, False)


def durable_replace(source: str, target: str) -> None:
    """``os.replace(source, target)`` with ``source``'s data synced before and the
    directory after: the new file is whole on the disk before its name points at it."""
    try:
        fd = os.open(source, os.O_RDONLY)
        try:
            synced_file(fd, source)
        finally:
            os.close(fd)
        os.replace(source, target)
        synced_directory(os.path.dirname(target))
    except OSError as exc:
        raise RaftDiskFailure(target, exc) from exc


def _durable_store_meta(self: Any, meta: dict[str, Any]) -> None:
    """pysyncobj's ``MetaStorer.storeMeta`` (term, vote, commit index), synced."""
    path = self.getPath()
    try:
        with open(path + ".tmp", "wb") as f:
            f.write(pysyncobj_journal.dumps(meta))
            f.flush()
            synced_file(f.fileno(), path + ".tmp")
        os.replace(path + ".tmp", path)
        synced_directory(os.path.dirname(path))
    except OSError as exc:
        raise RaftDiskFailure(path, exc) from exc


def _marks_writes(original: Callable[..., None]) -> Callable[..., None]:
    @functools.wraps(original)
    def write(self: Any, offset: int, values: bytes) -> None:
        setattr(self, PENDING, True)  # before: a write that fails part-way is pending too
        original(self, offset, values)
    return write


def _named_on_disk(original: Callable[..., None]) -> Callable[..., None]:
    @functools.wraps(original)
    def init(self: Any, fileName: str, *args: Any, **kwargs: Any) -> None:
        original(self, fileName, *args, **kwargs)
        try:  # a new file's header and its name (an existing one: a no-op sync)
            synced_file(self._ResizableFile__f.fileno(), fileName)
            synced_directory(os.path.dirname(fileName))
        except OSError as exc:
            raise RaftDiskFailure(fileName, exc) from exc
    return init


_installed = False


def install() -> None:
    """Patch pysyncobj's journal, term-and-vote file and dump writer (once).

    Call after :func:`cluster.raft_disk.install` (whose patches these wrap)."""
    global _installed
    if _installed:
        return
    _installed = True
    resizable = pysyncobj_journal.ResizableFile
    resizable.write = _marks_writes(resizable.write)
    resizable.__init__ = _named_on_disk(resizable.__init__)
    pysyncobj_journal.MetaStorer.storeMeta = _durable_store_meta
    pysyncobj_serializer.atomicReplace = durable_replace
