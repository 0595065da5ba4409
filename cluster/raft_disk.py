"""A seed whose ClusterDataDir cannot be written (disk full) stops, saying so.

pysyncobj 0.3.17 writes its journal through ``mmap`` into a file it grows with
``ftruncate``: a sparse file, whose blocks the kernel allocates when a page is first
written. On a full disk that write raised SIGBUS and the member died on the spot ("Bus
error", no log line; measured on a 128 KiB tmpfs): nothing unwritten was acknowledged,
but nothing said why, and it died again at each restart. Its term-and-vote file, and
this seed's journal trim (:mod:`cluster.raft_compaction`), write with plain ``write``:
``OSError`` on pysyncobj's Raft thread, logged as a traceback and retried every tick --
with the entry already in pysyncobj's log in memory, not on disk.

:func:`install` makes every such write raise :class:`RaftDiskFailure` instead: the
journal's blocks are allocated (``posix_fallocate``) when pysyncobj opens or grows the
file, before any byte is written there, so a full disk is an error at that moment and
the write that failed is not made. :class:`cluster.raft._SeedSyncObj` then stops taking
part in Raft (no tick handles another message: it neither acknowledges nor votes on what
it could not keep) and reports it; the member exits with the message
(:mod:`cluster.seed`). Its files are left whole; freed space, it starts again.

Allocated blocks are not enough on a copy-on-write file system (btrfs, ZFS): a page
rewritten after a sync needs new blocks, and pysyncobj rewrites the journal's header on
every entry. On a full 120 MB btrfs a seed still died by SIGBUS ("Fatal Python error:
Bus error", exit status 135). The journal's records are therefore written with
``pwrite`` (:func:`write_at`), not stored into the mapping, which pysyncobj still reads
(one page cache): the file system's refusal is an ``OSError`` (+1.5-2 us of CPU per
entry on this machine, against 0.1-0.4 ms for the entry's ``fdatasync``).

A journal grows by doubling: it needs as much free space as its size to grow once more.
Growing it can fail before any block is asked for: ``ftruncate`` refuses with EFBIG past
the process's file-size limit (``RLIMIT_FSIZE``), EROFS on a file system remounted
read-only after an error, EIO. pysyncobj then fell back to growing the file by appending
zeros, after closing its mapping: that failed the same way, and every later tick of the
Raft thread died on the closed file ("I/O operation on closed file", a traceback ten
times a second), the seed neither stopped nor said why
(``tests/cluster/test_raft_disk.py``, a seed limited by ``RLIMIT_FSIZE``). Such an
``OSError`` is a :class:`RaftDiskFailure` too.

The journal grows without ``mmap.resize`` (:func:`remapped`): CPython's keeps the GIL
in its ``ftruncate``, and a disk that stalls kept every thread of the process waiting
there, the event loop too.
"""

from __future__ import annotations

import contextlib
import errno
import functools
import logging
import mmap
import os
from collections.abc import Callable, Iterator
from typing import Any

from pysyncobj import journal as pysyncobj_journal

log = logging.getLogger("migratory.raft")

UNSUPPORTED = (errno.EOPNOTSUPP, errno.ENOSYS, errno.EINVAL)  # no fallocate there: as before


class RaftDiskFailure(OSError):
    """A Raft file could not be written: this seed must stop taking part in Raft."""

    def __init__(self, path: str, error: OSError) -> None:
        super().__init__(error.errno, f"cannot write {path} ({error.strerror or error})")
        self.path = path
        global _last_failure
        _last_failure = self


_last_failure: RaftDiskFailure | None = None  # the last one made in this process

NO_ROOM = (errno.ENOSPC, errno.EDQUOT, errno.EFBIG)


def remedy(failure: OSError) -> str:
    """What the operator does about ``failure`` (said in the seed's last log line)."""
    if failure.errno in NO_ROOM:
        return "free space in ClusterDataDir (or raise its quota or file-size limit)"
    if failure.errno in (errno.EMFILE, errno.ENFILE):  # not the disk: no descriptor left
        return "raise the open-file limit, or find what holds the member's descriptors"
    return ("look at the volume (the kernel log says why: an I/O error, a file system "
            "remounted read-only), mend or replace it")


@contextlib.contextmanager
def not_swallowed() -> Iterator[None]:
    """Raise again a :class:`RaftDiskFailure` that the code in this block caught.

    pysyncobj loads a dump (its own at start-up, or a leader's) under a bare ``except``
    that logs and goes on: a journal write that failed there -- with the entry already
    in its log in memory -- was followed by a success answer to the leader for it.
    """
    before = _last_failure
    yield
    if _last_failure is not before and _last_failure is not None:
        raise _last_failure


def allocate(fd: int, offset: int, length: int) -> None:
    """Blocks for ``[offset, offset + length)`` (the file grows to its end if shorter)."""
    try:
        os.posix_fallocate(fd, offset, length)
    except OSError as exc:
        if exc.errno not in UNSUPPORTED:
            raise


def _resizable_init(original: Callable[..., None]) -> Callable[..., None]:
    @functools.wraps(original)
    def init(self: Any, fileName: str, initialSize: int = 1024, *args: Any,
             defaultContent: bytes | None = None, **kwargs: Any) -> None:
        try:
            sized(fileName, initialSize, defaultContent)  # (pysyncobj's resize: none)
            original(self, fileName, initialSize, *args, defaultContent=defaultContent,
                     **kwargs)
            allocate(self._ResizableFile__f.fileno(), 0, self._ResizableFile__mm.size())
        except OSError as exc:
            raise RaftDiskFailure(fileName, exc) from exc
    return init


def sized(path: str, initial: int, content: bytes | None) -> None:
    """The file pysyncobj's ``ResizableFile`` opens, made (with ``content``, as it would)
    and at least ``initial`` bytes long, so that it resizes no mapping (see
    :func:`_resizable_write`)."""
    if not os.path.exists(path):
        with open(path, "wb") as file:
            file.write(content or b"")
            file.flush()
            os.ftruncate(file.fileno(), max(initial, len(content or b"")))
    elif 0 < os.path.getsize(path) < initial:  # (empty: pysyncobj's own error, as before)
        os.truncate(path, initial)


def _resizable_write(original: Callable[..., None]) -> Callable[..., None]:
    @functools.wraps(original)
    def write(self: Any, offset: int, values: bytes) -> None:
        mapped = self._ResizableFile__mm
        size, end = len(mapped), offset + len(values)  # (its size(): an fstat per write)
        fd = self._ResizableFile__f.fileno()
        try:
            if end > size:  # grown here as pysyncobj would, then its blocks allocated
                grown = max(int(size * self._ResizableFile__resizeFactor), end)
                os.ftruncate(fd, grown)
                allocate(fd, size, grown - size)
                self._ResizableFile__mm = remapped(mapped, fd, grown)
            write_at(fd, offset, values)
        except OSError as exc:  # (an OSError of the growth: see the module's docstring)
            raise RaftDiskFailure(self._ResizableFile__fileName, exc) from exc
    return write


def remapped(mapped: mmap.mmap, fd: int, size: int) -> mmap.mmap:
    """A mapping of the first ``size`` bytes of ``fd`` in place of ``mapped``.

    Not ``mapped.resize(size)``: CPython calls ``ftruncate`` there holding the GIL, and
    on a disk that stalls the kernel can keep it waiting (the file system's journal):
    every thread of the process waited with it, the event loop and each client too. A
    thread holding the file's inode lock (a 512 MiB ``posix_fallocate`` on tmpfs, 1.4 s)
    kept the main thread from running for 1.42-1.44 s through ``mmap.resize``, 15-28 ms
    through ``os.ftruncate``, which lets the GIL go (a machine at load 26;
    ``tests/cluster/test_raft_disk.py``: the main thread kept as long as the growth waited
    before, 0.22-0.31 s of 0.22-0.31 s, under half of it now)."""
    grown = mmap.mmap(fd, size)
    mapped.close()
    return grown


def write_at(fd: int, offset: int, values: bytes) -> None:
    """``values`` written at ``offset`` with ``pwrite``, not through the mapping: a
    write the file system refuses is an ``OSError`` here, where a store into the mapping
    was SIGBUS (the mapping reads what was written: one page cache)."""
    view = memoryview(values)
    while view:
        done = os.pwrite(fd, view, offset)
        view, offset = view[done:], offset + done


def _store_meta(original: Callable[..., None]) -> Callable[..., None]:
    @functools.wraps(original)
    def store(self: Any, meta: dict[str, Any]) -> None:
        try:
            original(self, meta)
        except RaftDiskFailure:
            raise  # (raft_durability's, when installed before this one: tests)
        except OSError as exc:
            raise RaftDiskFailure(self.getPath(), exc) from exc
    return store


def _resizable_destroy(original: Callable[..., None]) -> Callable[..., None]:
    @functools.wraps(original)
    def destroy(self: Any) -> None:
        """Closed even when its last flush fails (a seed stopped by its disk ends so):
        pysyncobj's raised, a traceback as the Raft thread ended, the file left open."""
        try:
            original(self)
        except (OSError, ValueError) as exc:  # (ValueError: a mapping already closed)
            with contextlib.suppress(OSError, ValueError):
                self._ResizableFile__mm.close()
            with contextlib.suppress(OSError, ValueError):
                self._ResizableFile__f.close()
            log.warning("Raft: closing %s: %s", self._ResizableFile__fileName, exc)
    return destroy


_installed = False


def install() -> None:
    """Patch pysyncobj's journal file and term-and-vote file (once)."""
    global _installed
    if _installed:
        return
    _installed = True
    resizable = pysyncobj_journal.ResizableFile
    resizable.__init__ = _resizable_init(resizable.__init__)
    resizable.write = _resizable_write(resizable.write)
    resizable._destroy = _resizable_destroy(resizable._destroy)
    storer = pysyncobj_journal.MetaStorer
    storer.storeMeta = _store_meta(storer.storeMeta)
