"""A Standard member's lives on its data directory, so that a cleanly drained member's
next life can say which life came just before it and that it ended cleanly.

A restarted Standard member numbers every subject from seq 1 again, in new epochs: on
its own, a peer cannot tell whether a life between the one it last met and this one
published and died without reaching it, so it resyncs every subject it held before
(:mod:`cluster.standard_lineage`). With a ``ClusterDataDir`` each life records itself in
``standard-life-<member>`` **before it takes any publish** (written, fsync'ed, renamed, the
directory fsync'ed): ``{"life": id, "clean": false}``. A SIGTERM's drain, once the server
has stopped (no client publishes), sends each peer a :class:`~cluster.link.StandardGoodbye`
after every forward to it (and every repair: a forward dropped or lost with a link is
sent again first) and, when no forward was numbered after the first goodbye, records
``"clean": true``. The next life reads the record before it overwrites it: a clean one
names its predecessor in its incarnation (``"<own id>/<clean predecessor id>"``; a
plain ``"<id>/"`` without one -- the slash says that it reads goodbyes).

A peer chains the new life to the one it met last only when that one said goodbye to it
(every forward of it came, or was told as a gap) and the new life names it as its clean
predecessor. A life between them that published and died without reaching the peer
recorded itself first, so the next life names that one -- not clean -- and nothing is
chained. What this relies on (docs/cluster.md, "Standard mode"): the directory is the
member's own (not shared by two processes at once) and is never put back to an older
copy; a lost directory only costs the chain (a new life without a predecessor).
"""

from __future__ import annotations

import json
import logging
import os
import secrets
from pathlib import Path

log = logging.getLogger("migratory.cluster")

__all__ = ["LifeRecord", "clean_predecessor", "life_id", "new_incarnation", "reads_goodbyes"]

RECORD = "standard-life"
"""The record's file name in ``ClusterDataDir``, then ``-<member>`` (its
ClusterMemberListen, ``:`` and any other character but letters, digits, ``.`` and
``-`` as ``_``): members given one directory keep their records apart."""


def _file_name(member: str) -> str:
    return "".join(c if c.isascii() and (c.isalnum() or c in ".-") else "_" for c in member)


def new_incarnation(predecessor: str | None) -> tuple[str, str]:
    """A new life's id and its incarnation (link settings) naming ``predecessor``, the
    id of the life just before it on this directory when that one ended cleanly."""
    own = secrets.token_hex(8)
    return own, f"{own}/{predecessor or ''}"


def reads_goodbyes(incarnation: str | None) -> bool:
    """Whether the member of this incarnation reads a StandardGoodbye (an older one
    sends a plain random incarnation, without a slash, and would end the link on it)."""
    return incarnation is not None and "/" in incarnation


def life_id(incarnation: str) -> str:
    return incarnation.split("/", 1)[0]


def clean_predecessor(incarnation: str | None) -> str | None:
    """The id of the life before the one of ``incarnation``, when it ended cleanly."""
    if incarnation is None or "/" not in incarnation:
        return None
    return incarnation.split("/", 1)[1] or None


class LifeRecord:
    """``ClusterDataDir/standard-life-<member>``: the life that runs (or ran last) and whether it
    ended cleanly."""

    def __init__(self, directory: Path, member: str = "") -> None:
        self.path = directory / (RECORD + (f"-{_file_name(member)}" if member else ""))
        self.member = member
        """Whose lives (its ClusterMemberListen), in the record too: a record that names
        another member (a file copied from another) names no predecessor here."""

    def begin(self) -> tuple[str, str]:
        """Read the last life's record, then record a new life (durably, before any
        publish is taken): its id and incarnation. Raises OSError when the record cannot
        be written: a next life would otherwise name the one before as its clean
        predecessor, skipping this one."""
        predecessor = self._clean_life()
        own, incarnation = new_incarnation(predecessor)
        try:
            self._write(own, clean=False)
        except OSError as exc:
            raise OSError(exc.errno, f"cannot record this life in {self.path}: "
                                     f"{exc.strerror or exc}") from exc
        return own, incarnation

    def end_clean(self, own: str) -> None:
        self._write(own, clean=True)

    def end_unclean(self, own: str) -> None:
        """A forward numbered after a goodbye: the next life names no predecessor."""
        self._write(own, clean=False)

    def _clean_life(self) -> str | None:
        try:
            record = json.loads(self.path.read_text(encoding="utf-8"))
        except FileNotFoundError:
            return None
        except (OSError, ValueError) as exc:
            log.warning("%s unreadable (%s): this life names no predecessor", self.path, exc)
            return None
        if (type(record) is dict and record.get("clean") is True
                and record.get("member", "") == self.member
                and type(record.get("life")) is str and record["life"]):
            return str(record["life"])
        return None

    def _write(self, own: str, *, clean: bool) -> None:
        directory = self.path.parent
        directory.mkdir(parents=True, exist_ok=True)
        part = self.path.with_name(self.path.name + ".part")
        with part.open("w", encoding="utf-8") as file:
            json.dump({"member": self.member, "life": own, "clean": clean}, file)
            file.flush()
            os.fsync(file.fileno())
        os.replace(part, self.path)
        handle = os.open(directory, os.O_RDONLY)
        try:
            os.fsync(handle)
        finally:
            os.close(handle)
