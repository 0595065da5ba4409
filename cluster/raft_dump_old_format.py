"""The leader's dump as 524f73f loads it, for a seed that does not take this version's.

A seed of 524f73f cannot load the dump this version writes (its caches packed:
:mod:`cluster.dump_decoder`), and :mod:`cluster.dump_downgrade` rewrites a dump in the
format it loads (this version loads both). :class:`OldFormatDump` keeps such a copy of
the leader's ``raft.dump`` beside it (``raft.dump.524f73f``), made in a thread of its
own (decoding a dump takes seconds at a million subjects: never on the Raft thread)
the first time a seed needs it, and again for each new dump; the leader sends it to a
seed that did not take the dump it was sent (:mod:`cluster.raft_dump_untaken`). It
takes about as much disk as the dump; a seed removes it when it starts (so once every
seed is upgraded, their next restart leaves none).
"""

from __future__ import annotations

import logging
import os
import shutil
import threading
import time
from pathlib import Path
from typing import IO, Any

from cluster.dump_downgrade import downgrade

log = logging.getLogger("migratory.raft")

__all__ = ["SUFFIX", "OldFormatDump"]

SUFFIX = ".524f73f"
"""The copy's name: the dump's, and this."""

_Key = tuple[int, int, int]  # a dump file's (inode, mtime in ns, size)


def _key(stat: os.stat_result) -> _Key:
    return stat.st_ino, stat.st_mtime_ns, stat.st_size


class OldFormatDump:
    """The dump at ``dump_file`` rewritten for 524f73f, once per dump."""

    def __init__(self, dump_file: str) -> None:
        self._dump = Path(dump_file)
        self._copy = self._dump.with_name(self._dump.name + SUFFIX)
        temporary = self._copy.name + ".tmp"  # (and dump_downgrade's own beside it)
        for name in (self._copy.name, temporary, temporary + ".downgrade.tmp"):
            stale = self._copy.with_name(name)
            stale.unlink(missing_ok=True)  # a copy made before this start: not kept
        self._lock = threading.Lock()
        self._made_for: _Key | None = None  # the dump the copy was made of
        self._failed_for: _Key | None = None  # a dump that could not be rewritten
        self._making = False
        self.made = 0  # copies made (the dumps rewritten)

    def open(self) -> IO[bytes] | None:
        """The copy of the current dump, open to be sent; None while it is being made
        (begun here if it is not: ask again later) or if there is no dump."""
        try:
            current = _key(self._dump.stat())
        except FileNotFoundError:
            return None
        with self._lock:
            if self._made_for == current:
                try:
                    return self._copy.open("rb")
                except FileNotFoundError:
                    self._made_for = None
            if self._making or self._failed_for == current:
                return None
            self._making = True
        threading.Thread(target=self._make, name="raft-dump-524f73f", daemon=True).start()
        return None

    def _make(self) -> None:
        temporary = self._copy.with_name(self._copy.name + ".tmp")
        began = time.monotonic()
        made_for: _Key | None = None
        failed = False
        try:
            # a dump is replaced whole (renamed into place): the file opened is one dump
            with self._dump.open("rb") as source, temporary.open("wb") as target:
                made_for = _key(os.fstat(source.fileno()))
                shutil.copyfileobj(source, target)
            caches = downgrade(temporary)
            os.replace(temporary, self._copy)
            log.info("Raft: this leader's dump rewritten for 524f73f (%d cache(s) unpacked) "
                     "in %.1f s, for the seeds that do not take it", caches,
                     time.monotonic() - began)
            self.made += 1
        except Exception:  # (a thread of its own: logged, and the packed dump goes on)
            failed = True
            log.exception("Raft: this leader's dump could not be rewritten for 524f73f")
            temporary.unlink(missing_ok=True)
        with self._lock:
            if failed:  # not again for this dump
                self._failed_for, self._made_for = made_for, None
            else:
                self._made_for = made_for
            self._making = False


def send_copy(serializer: Any, transmission_id: Any, copy: IO[bytes]) -> None:
    """Make ``copy`` the file pysyncobj's ``serializer`` transmits to
    ``transmission_id`` from its next chunk on (a transmission not begun)."""
    transmissions = serializer._Serializer__transmissions
    transmissions[transmission_id] = {"file": copy, "transmitted": 0}
