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
dies, closes the child's copies of every socket (the parent keeps its own), and
lowers the child's CPU priority to the least (nice 19).

Why the priority: every seed compacts at the same log index, so all of them fork at
once, and each child spends ~0.2 s of CPU pickling and gzip-compressing a 2 MB dump
(16 subjects x 1,000 cached messages). On two cores those children took the CPU from
the members for that second, and acknowledgements waited 30-45 ms in it: the
benchmark's p99.9 misses (docs/benchmarks.md, "compaction"). At nice 19 a child gets
about 1.5 % of a core the members want and all of an idle one; the dump is finished
when it is finished (pysyncobj polls the child and keeps the log until then).
"""

from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import os
import signal
import stat

PR_SET_PDEATHSIG = 1
DUMP_WRITER_NICENESS = 19

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


def yield_cpu() -> None:
    """The least CPU priority for this process (it runs when the members do not)."""
    # where not permitted, the dump is written at the member's priority
    with contextlib.suppress(OSError):
        os.setpriority(os.PRIO_PROCESS, 0, DUMP_WRITER_NICENESS)


def release_after_fork() -> None:
    parent = os.getppid()
    die_with_parent(parent)
    close_sockets()
    yield_cpu()


def register() -> None:
    """Install :func:`release_after_fork` for every fork of this process (once)."""
    global _registered
    if not _registered and os.path.isdir("/proc/self/fd"):
        os.register_at_fork(after_in_child=release_after_fork)
        _registered = True
