"""Whether one connection's flood waits for the others' turn, shown by order, not time.

The server process is frozen (SIGSTOP) while two bystanders' publishes and, between
them, an attacker's flood are queued in the kernel, so that when it runs again
(SIGCONT) all three are ready at once whatever the machine's load, in that order (the
epoll ready list keeps it; trio runs a batch in that order or reversed: either way one
bystander comes after the attacker). The attacker is subscribed to the bystanders'
subject: its one stream shows, in the order the server handled them, the answers to its
own flood and the bystanders' messages. A fair server gives each connection turns of at
most ``OPERATIONS_PER_TURN`` operations (migratory/server/connection.py), so before the
last bystander message come at most two turns of the attacker's answers. A server that
handles a whole received chunk (64 KiB: 32,768 PINGREQs), or the whole flood, before
the others puts thousands there.
"""

from __future__ import annotations

import os
import signal
import socket
from collections.abc import Iterator, Sequence
from contextlib import contextmanager

from migratory.server.connection import OPERATIONS_PER_TURN

FAIR_RUN = 2 * OPERATIONS_PER_TURN
"""The most answers to the attacker a fair server puts between two bystander messages."""


@contextmanager
def frozen(pid: int) -> Iterator[None]:
    """The server process stopped for the duration (it is the test's own child)."""
    os.kill(pid, signal.SIGSTOP)
    try:
        yield
    finally:
        os.kill(pid, signal.SIGCONT)


def queue_without_blocking(sock: socket.socket, data: bytes) -> int:
    """Send as much of ``data`` as the kernel takes now; the bytes queued."""
    sock.setblocking(False)
    sent = 0
    try:
        while sent < len(data):
            sent += sock.send(data[sent:sent + 65536])
    except BlockingIOError:
        pass
    finally:
        sock.setblocking(True)
    return sent


def longest_attacker_run(stream: Sequence[bool]) -> int:
    """In the attacker's stream (True: a bystander message, False: an answer to the
    attacker), the most answers in a row before the last bystander message: while the
    bystander still had messages waiting (they were all ready from the start)."""
    last = len(stream) - 1 - stream[::-1].index(True)
    longest = run = 0
    for is_bystander in stream[:last]:
        run = 0 if is_bystander else run + 1
        longest = max(longest, run)
    return longest
