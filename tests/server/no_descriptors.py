"""A process with no file descriptor left (EMFILE), for as long as a ``with`` block lasts.

The soft open-file limit is lowered to just above the descriptors already open and the
rest filled with /dev/null; both undone at the end. Sockets made before the block can
still connect, send and receive inside it (that needs no new descriptor).
"""

from __future__ import annotations

import contextlib
import os
import resource
from collections.abc import Iterator


@contextlib.contextmanager
def no_descriptor_left() -> Iterator[int]:
    """Every descriptor this process may open is open (yields how many were filled)."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    highest = max(int(fd) for fd in os.listdir("/proc/self/fd"))
    resource.setrlimit(resource.RLIMIT_NOFILE, (min(soft, highest + 32), hard))
    held: list[int] = []
    try:
        with contextlib.suppress(OSError):
            for _ in range(100_000):
                held.append(os.open(os.devnull, os.O_RDONLY))
        assert held, "nothing was filled"
        yield len(held)
    finally:
        for fd in held:
            os.close(fd)
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
