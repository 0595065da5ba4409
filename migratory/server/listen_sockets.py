"""The listening sockets of a server process, and the open-file limit they need.

Bound, listening and non-blocking before trio runs them; ``SO_REUSEPORT`` when several
worker processes share a port (docs/workers.md).
"""

from __future__ import annotations

import resource
import socket
from collections.abc import Sequence


def raise_open_file_limit() -> int:
    """Raise the soft RLIMIT_NOFILE to the hard limit; return the new soft limit."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard == resource.RLIM_INFINITY or soft < hard:
        target = hard if hard != resource.RLIM_INFINITY else 1 << 20
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
            return target
        except (ValueError, OSError):
            return soft
    return soft


def open_listeners(
    addresses: Sequence[tuple[tuple[str, int], str]], *, reuse_port: bool = False
) -> list[socket.socket]:
    """Bound, listening, non-blocking sockets, one per ``(address, config key)``;
    ``reuse_port``: SO_REUSEPORT, so several worker processes listen on one port and the
    kernel spreads connections over them. An address that cannot be bound raises an
    OSError naming it and its key."""
    listeners = []
    try:
        for (host, port), key in addresses:
            family = socket.AF_INET6 if ":" in host else socket.AF_INET
            sock = socket.socket(family, socket.SOCK_STREAM)
            listeners.append(sock)
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            if reuse_port:
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
            try:
                sock.bind((host, port))
            except OSError as exc:
                message = f"cannot listen on {host}:{port} ({key}): {exc.strerror}"
                raise OSError(exc.errno, message) from None
            sock.listen(4096)
            sock.setblocking(False)
    except BaseException:
        for sock in listeners:
            sock.close()
        raise
    return listeners
