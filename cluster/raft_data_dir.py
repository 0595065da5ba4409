"""A seed looks at its ``ClusterDataDir`` before pysyncobj opens it, and refuses damage.

pysyncobj 0.3.17 trusts its files. Its journal (``raft.journal``: a 40-byte header,
then records ``size | index, term, command | size`` up to the offset the header gives)
has no checksum and is read without a check, so a damaged one came back as

- a *shorter log* without a word: a header whose end offset was zeroed or rewound, or a
  record whose size field was overwritten, ends the read early -- the seed then votes
  and may lead as if it held everything it had acknowledged (``test_raft_data_dir.py``
  has a schedule on real nodes where that loses an acknowledged entry);
- a raw traceback at start-up (``cannot mmap an empty file``, ``struct.error``);
- a silently different state: a command whose type byte was overwritten is skipped
  as a no-op, one batch of publishes never numbered on that seed.

Its term and vote (``raft.journal.meta``) are read with a bare ``except``: garbage, an
empty file or one that cannot be read gave term 0 and no vote, and the seed could vote
twice in a term. A dump (``raft.dump``) that does not load was logged once and left the
seed applying nothing for ever (its journal starts after the dump), still voting; a
journal that starts after entry 1 with no dump at all, the same without a log line.

:func:`check` reads them first and raises :class:`DamagedRaftData` (an ``OSError``,
``EUCLEAN``: the member exits with its message, docs/cluster.md "A damaged
ClusterDataDir") on anything pysyncobj would not have written. What it cannot see: a
journal that lost its last records *consistently* (power loss: pysyncobj writes through
``mmap`` without ``fsync``, and the header may reach the disk before or after the
records) looks like a shorter, whole one; it is refused only when its term-and-vote file
recorded a commit index past its end. Bytes flipped inside a command's arguments are
not seen either (no checksum; a record's shape, indices, terms, type byte and pickle
framing are).
"""

from __future__ import annotations

import errno
import gzip
import logging
import mmap
import os
import stat
import struct
import zlib
from dataclasses import dataclass
from typing import Any

from pysyncobj.journal import (
    APP_NAME,
    FIRST_RECORD_OFFSET,
    JOURNAL_FORMAT_VERSION,
    NAME_SIZE,
    FileJournal,
)

from cluster import raft_unpickler
from cluster.raft_compaction import TRIM_SUFFIX

log = logging.getLogger("migratory.raft")

HEADER = FIRST_RECORD_OFFSET  # name (24) + version (8) + format (4) + records' end (4)
COMMAND_TYPES = {0: "regular", 1: "no-op", 2: "membership", 3: "version"}
PICKLED_TYPES = (0, 3)  # the type byte, then a pickle of protocol 2: 0x80 0x02 ... "."
TERM_STORED = "setCurrentTerm" in vars(FileJournal)
"""Whether the installed pysyncobj keeps the term and vote in the meta file (this
0.3.17 build does, synchronously; a build that does not would fail the term checks of
every restart: they are skipped then, and ``test_raft_data_dir.py`` fails its canary)."""
REMEDY = (
    "the seed does not start on it (it could come back with less than it acknowledged). "
    "Move the directory aside and start the seed on an empty one: it rejoins as a seed "
    "that lost its disk and votes once it holds the leader's log again "
    "(docs/cluster.md, 'A damaged ClusterDataDir')"
)

ACCESS_ERRORS = (errno.EACCES, errno.EPERM, errno.EROFS)
ACCESS_REMEDY = (
    "the seed keeps its Raft files there: give this server's user read and write access "
    "to the directory and its files, and search access to its parents, or set another "
    "ClusterDataDir"
)
"""What to do when the kernel refuses the files: the data may be whole, so nothing
is to be moved aside (a seed started on an empty directory has lost its disk)."""


class DamagedRaftData(OSError):
    """A Raft file in ``ClusterDataDir`` this seed cannot trust (or cannot open)."""

    def __init__(self, path: str, problem: str, remedy: str = REMEDY) -> None:
        super().__init__(errno.EUCLEAN, f"ClusterDataDir: {path}: {problem}; {remedy}")
        self.path = path
        self.problem = problem


@dataclass(frozen=True, slots=True)
class JournalSummary:
    entries: int
    first_index: int  # 0 when there is no entry
    last_index: int
    last_term: int


def read_journal(data: bytes | mmap.mmap) -> JournalSummary:
    """What a journal holds; ``ValueError`` naming the first thing wrong in it."""
    if len(data) < HEADER:
        raise ValueError(f"{len(data)} bytes, shorter than the {HEADER}-byte header")
    name = data[:NAME_SIZE].rstrip(b"\0")
    if name != APP_NAME:
        raise ValueError(f"the header does not start with {APP_NAME!r} but {name[:24]!r}")
    fmt, end = struct.unpack_from("<II", data, HEADER - 8)
    if fmt != JOURNAL_FORMAT_VERSION:
        raise ValueError(f"journal format {fmt}, expected {JOURNAL_FORMAT_VERSION}")
    if not HEADER <= end <= len(data):
        raise ValueError(f"the header puts the end of the records at byte {end}, "
                         f"the file has {len(data)}")
    entries, first, index, term, offset = 0, 0, 0, 0, HEADER
    while offset < end:
        where = f"the record at byte {offset}"
        if offset + 4 + 16 > end:
            raise ValueError(f"{where} is cut off by the end of the records ({end})")
        (size,) = struct.unpack_from("<I", data, offset)
        if size < 17:
            raise ValueError(f"{where} has size {size} (index, term and command: 17 at least)")
        if offset + size + 8 > end:
            raise ValueError(f"{where} has size {size}, past the end of the records ({end})")
        if data[offset + 4 + size:offset + 8 + size] != data[offset:offset + 4]:
            raise ValueError(f"{where}: its two size fields differ")
        at, at_term = struct.unpack_from("<QQ", data, offset + 4)
        if entries and at != index + 1:
            raise ValueError(f"{where} holds entry {at} after entry {index}")
        if at_term < term:
            raise ValueError(f"{where} (entry {at}) is of term {at_term} after term {term}")
        _check_command(data[offset + 20:offset + 4 + size], where)
        entries, first = entries + 1, first or at
        index, term, offset = at, at_term, offset + size + 8
    return JournalSummary(entries, first, index, term)


def _check_command(command: bytes, where: str) -> None:
    kind = command[0]
    if kind not in COMMAND_TYPES:
        raise ValueError(f"{where} has command type {kind} (pysyncobj writes 0 to 3)")
    if kind in PICKLED_TYPES and not (command[1:3] == b"\x80\x02" and command[-1:] == b"."):
        raise ValueError(f"{where}: its {COMMAND_TYPES[kind]} command is not a whole pickle")


def read_meta(data: bytes) -> dict[str, Any]:
    """pysyncobj's term-and-vote file; ``ValueError`` if it is not one."""
    try:
        meta = raft_unpickler.loads(data)
    except Exception as exc:  # whatever garbage makes the unpickler raise
        raise ValueError(f"not a pickle ({type(exc).__name__}: {exc})") from None
    if not isinstance(meta, dict):
        raise ValueError(f"holds a {type(meta).__name__}, not pysyncobj's dict")
    for key in ("currentTerm", "raftCommitIndex"):
        if not isinstance(meta.get(key, 0), int) or meta.get(key, 0) < 0:
            raise ValueError(f"{key} is {meta.get(key)!r}")
    return meta


def read_dump(path: str) -> None:
    """The whole gzip stream, checked against its CRC and length (no unpickling: the
    dump can be large and pysyncobj loads it next); ``ValueError`` if it does not."""
    read = 0
    try:
        with gzip.open(path, "rb") as stream:
            while chunk := stream.read(1 << 20):
                read += len(chunk)
    except (EOFError, gzip.BadGzipFile, zlib.error) as exc:
        raise ValueError(f"not a whole gzip stream ({type(exc).__name__}: {exc})") from None
    if read == 0:
        raise ValueError("empty")


def _read(path: str, mode: str = "rb", size: int = -1) -> bytes | None:
    """The file's first ``size`` bytes (all: -1), None if there is no file; opened as
    pysyncobj opens it (``r+b``: the journal, written in place)."""
    if not os.path.lexists(path):
        return None
    try:
        with open(path, mode) as f:
            data: bytes = f.read(size)
    except OSError as exc:
        remedy = ACCESS_REMEDY if exc.errno in ACCESS_ERRORS else REMEDY
        raise DamagedRaftData(path, f"cannot be opened ({exc.strerror})", remedy) from None
    return data


def temporary_files(journal_file: str, dump_file: str | None) -> list[str]:
    """The files a seed writes whole before renaming them into place: a dump (its
    writer's, and one received from the leader), the term and vote, a trimmed journal.
    One is left half-written when the seed is killed while writing it."""
    paths = [journal_file + ".meta.tmp", journal_file + TRIM_SUFFIX]
    if dump_file is not None:
        paths += [dump_file + ".tmp", dump_file + ".1.tmp"]
    return paths


def remove_stale(journal_file: str, dump_file: str | None) -> list[str]:
    """Remove what :func:`temporary_files` a killed seed left, each said in one line; the
    paths removed. pysyncobj never reads them (it reads the file they would have
    replaced, whole or not there: the rename is the last step), but a half-written dump
    took as much space as a dump until the next one replaced it (a full disk stops the
    seed), and nothing said why it was there."""
    removed = []
    for path in temporary_files(journal_file, dump_file):
        try:
            found = os.lstat(path)
            if not stat.S_ISREG(found.st_mode):
                continue  # not a seed's (a directory: the writer fails on it, saying so)
            size = found.st_size
            os.remove(path)
        except FileNotFoundError:
            continue
        except OSError as exc:  # (a read-only volume stops the seed at its first write)
            log.warning("ClusterDataDir: %s, left half-written by a seed stopped while "
                        "writing it, cannot be removed (%s)", path, exc.strerror)
            continue
        log.warning("ClusterDataDir: removed %s (%d bytes), left half-written by a seed "
                    "stopped while writing it; the file it was to replace is used as it "
                    "is", path, size)
        removed.append(path)
    return removed


def check(journal_file: str, dump_file: str | None, marker: str) -> None:
    """Raise :class:`DamagedRaftData` unless pysyncobj may open these files.

    ``marker``: the empty-start marker (:mod:`cluster.raft_votes`), there until a seed
    that started without a journal has caught up. A journal of 0 bytes next to it alone
    is the first start killed while pysyncobj created the file: removed, the seed starts
    empty as it was going to. The temporary files of a seed killed mid-write are
    removed first (:func:`remove_stale`).
    """
    remove_stale(journal_file, dump_file)
    journal = _read(journal_file, "r+b", size=0)  # (pysyncobj writes it in place)
    meta = _read(journal_file + ".meta")
    has_dump = dump_file is not None and _read(dump_file, size=0) is not None
    if journal is None:
        if has_dump or meta is not None:
            kept = dump_file if has_dump else journal_file + ".meta"
            raise DamagedRaftData(journal_file, f"missing, while {kept} is there")
        return
    empty = os.path.getsize(journal_file) == 0
    if empty and os.path.exists(marker) and meta is None and not has_dump:
        os.remove(journal_file)
        return
    try:
        summary = read_journal(b"") if empty else _map_and_read(journal_file)
    except ValueError as exc:
        raise DamagedRaftData(journal_file, str(exc)) from None
    _check_against_meta(journal_file, summary, meta)
    if summary.first_index > 1 and not has_dump:
        raise DamagedRaftData(journal_file, f"starts at entry {summary.first_index}, but "
                              f"there is no {dump_file or 'dump'} with the state before it")
    if summary.entries == 0 and not (has_dump or os.path.exists(marker)):
        # (beside a dump: pysyncobj empties the journal, then writes the dump's last two
        # entries; beside the marker: it writes its first entry after creating the file)
        raise DamagedRaftData(journal_file, "holds no entry at all")
    if has_dump:
        assert dump_file is not None
        try:
            read_dump(dump_file)
        except ValueError as exc:
            raise DamagedRaftData(dump_file, str(exc)) from None


def _map_and_read(journal_file: str) -> JournalSummary:
    """:func:`read_journal` over the file mapped, not copied (it can be large)."""
    with open(journal_file, "rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as data:
        return read_journal(data)


def _check_against_meta(
    journal_file: str, summary: JournalSummary, meta_bytes: bytes | None
) -> None:
    path = journal_file + ".meta"
    if meta_bytes is None:
        if TERM_STORED and summary.last_term > 0:  # stored before any entry of its term
            raise DamagedRaftData(path, f"missing, while {journal_file} holds entries "
                                  f"of term {summary.last_term} (the vote is lost)")
        return
    try:
        meta = read_meta(meta_bytes)
    except ValueError as exc:
        raise DamagedRaftData(path, f"{exc} (the term and vote are lost)") from None
    term, commit = meta.get("currentTerm", 0), meta.get("raftCommitIndex", 1)
    if TERM_STORED and summary.last_term > term:
        raise DamagedRaftData(path, f"current term {term}, but {journal_file} holds "
                              f"entries of term {summary.last_term}")
    if summary.entries and commit > summary.last_index:
        raise DamagedRaftData(journal_file, f"ends at entry {summary.last_index}, but "
                              f"entry {commit} was committed (it lost entries)")
