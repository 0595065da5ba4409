"""A power loss for the Raft simulation: only what was synced survives it.

:class:`SyncedDisk` stands in for :func:`cluster.raft_durability.sync_file` and
:func:`~cluster.raft_durability.sync_directory` (the only ways our Raft code makes
anything durable) and records what each made durable: a file's bytes as of its last
``sync_file``, and a directory's names as of its last ``sync_directory``.
:meth:`SyncedDisk.power_loss` then leaves a node's files as a machine that lost power
would in the worst case: the names its directory had at its last sync, each with the
bytes its file had at its last sync (empty if never synced); everything written,
created, renamed or removed since is undone. (A real disk may keep more; never less.)

Writes through ``mmap`` count only once synced too: pysyncobj's ``mmap.flush`` (msync)
is not recorded, so code that relied on it would show up here.
"""

from __future__ import annotations

import os
from pathlib import Path


class SyncedDisk:
    def __init__(self) -> None:
        self.data: dict[int, bytes] = {}  # inode -> its bytes at its last sync
        self.names: dict[str, dict[str, int]] = {}  # directory -> {name: inode}
        self.file_syncs = 0
        self.directory_syncs = 0
        self.losses = 0

    def sync_file(self, fd: int) -> None:
        self.file_syncs += 1
        with open(f"/proc/self/fd/{fd}", "rb") as f:  # (fd may be open write-only)
            self.data[os.fstat(fd).st_ino] = f.read()

    def sync_directory(self, path: str) -> None:
        self.directory_syncs += 1
        directory = Path(path or ".")
        self.names[str(directory)] = {
            entry.name: entry.stat().st_ino for entry in directory.iterdir() if entry.is_file()
        }

    def power_loss(self, directory: Path, prefix: str) -> None:
        """The files named ``prefix*`` in ``directory`` as the disk holds them."""
        self.losses += 1
        for path in directory.glob(prefix + "*"):
            path.unlink()
        names = self.names.setdefault(str(directory), {})
        for name, inode in list(names.items()):
            if name.startswith(prefix):
                content = self.data.get(inode, b"")
                path = directory / name
                path.write_bytes(content)
                # what came back is on the disk, under its new inode
                names[name] = path.stat().st_ino
                self.data[names[name]] = content
