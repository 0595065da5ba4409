"""The process pysyncobj forks to write its Raft dump: it must not hold our ports.

pysyncobj writes a log compaction's dump in a forked child (copy-on-write, so the
Raft thread does not stall while pickling). A fork inherits every open socket --
the client listener, the cluster link, the Raft port -- and the child outlives its
parent when the parent is SIGKILLed mid-dump. The restarted member then found its
own ports taken ("cannot listen on ...: Address already in use": exit 1, seen in a
30-minute chaos run with every seed killed after compactions), and a late child
could even replace the restarted member's newer dump with an older one.

:func:`release_after_fork` runs in every child forked from a member (registered
with ``os.register_at_fork``): it asks the kernel to kill the child when its parent
dies and closes the child's copies of every socket (the parent keeps its own).
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os
import signal
import stat

PR_SET_PDEATHSIG = 1

_registered = False


def die_with_parent(parent: int) -> None:
    """SIGKILL this process when its parent dies (Linux); at once if it already has."""
    libc_name = ctypes.util.find_library("c")
    if libc_name is not None:
        libc = ctypes.CDLL(libc_name, use_errno=True)
        libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    if os.getppid() != parent:  # the parent died before the line above took effect
        os._exit(1)


def close_sockets() -> int:
    """Close this process's socket file descriptors; returns how many."""
    closed = 0
    for name in os.listdir("/proc/self/fd"):
        fd = int(name)
        try:
            if stat.S_ISSOCK(os.fstat(fd).st_mode):
                os.close(fd)
                closed += 1
        except OSError:
            continue  # the directory's own descriptor, or one closed meanwhile
    return closed


def release_after_fork() -> None:
    parent = os.getppid()
    die_with_parent(parent)
    close_sockets()


def register() -> None:
    """Install :func:`release_after_fork` for every fork of this process (once)."""
    global _registered
    if not _registered and os.path.isdir("/proc/self/fd"):
        os.register_at_fork(after_in_child=release_after_fork)
        _registered = True
