"""The fan-out benchmark's Server-Sent Events subscribers (``fanout.py --front-end sse``).

Each process opens its share of ``GET /events?subject=…`` streams (plain or,
with ``--tls``, https verified against the benchmark's own CA), waits for each
stream's ``subscribe`` event, then counts the stamps in the raw bytes exactly
like the WebSocket subscribers (``migratory.bench.subscriber.count_deliveries``): no
SSE or JSON parsing, one regex scan per ``recv``.
"""

from __future__ import annotations

import multiprocessing.connection as mpc
import signal
import socket
import ssl
import time
from collections import Counter

from migratory.bench.procfs import die_with_parent, raise_nofile
from migratory.bench.stamp import subject_for
from migratory.bench.subscriber import count_deliveries
from migratory.bench.wsraw import RECV_SIZE, RawConn, close_all

READY = b"event: subscribe"


class TlsRecv:
    """An ``SSLSocket`` that reads like a non-blocking plain one: ``recv`` returns
    every decrypted byte available and raises BlockingIOError when there is none."""

    def __init__(self, sock: ssl.SSLSocket) -> None:
        self.tls = sock

    def fileno(self) -> int:
        return self.tls.fileno()

    def recv(self, size: int) -> bytes:
        chunks = []
        try:
            while True:
                chunk = self.tls.recv(size)
                if not chunk:
                    break
                chunks.append(chunk)
                if not self.tls.pending():
                    break
        except ssl.SSLWantReadError:
            if not chunks:
                raise BlockingIOError from None
        return b"".join(chunks)

    def close(self) -> None:
        self.tls.close()


def open_stream(
    host: str, port: int, subject: str, tls: ssl.SSLContext | None, deadline: float
) -> RawConn:
    sock = socket.create_connection((host, port), timeout=max(0.1, deadline - time.monotonic()))
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    if tls is not None:
        sock = tls.wrap_socket(sock, server_hostname="localhost")
    sock.sendall(f"GET /events?subject={subject} HTTP/1.1\r\nHost: {host}\r\n\r\n".encode())
    buf = b""
    while READY not in buf:
        data = sock.recv(RECV_SIZE)
        if not data:
            raise ConnectionError("closed before the subscribe event")
        buf += data
    end = buf.index(b"\n\n", buf.index(READY)) + 2
    sock.setblocking(False)
    reader = TlsRecv(sock) if isinstance(sock, ssl.SSLSocket) else sock
    return RawConn(0, reader, state="open", buf=buf[end:])  # type: ignore[arg-type]


def sse_subscriber_main(
    ctrl: mpc.Connection,
    host: str,
    port: int,
    first: int,
    count: int,
    setup_timeout: float,
    lifetime: float,
    subjects: int = 1,
    ca_file: str | None = None,
) -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    die_with_parent()
    raise_nofile()
    hard_deadline = time.monotonic() + lifetime
    tls = ssl.create_default_context(cafile=ca_file) if ca_file else None
    started = time.monotonic()
    deadline = started + setup_timeout
    ready: list[RawConn] = []
    failures: Counter[str] = Counter()
    for index in range(first, first + count):
        try:
            conn = open_stream(host, port, subject_for(index, subjects), tls, deadline)
            conn.index = index
            ready.append(conn)
        except (OSError, ValueError) as exc:
            failures[f"setup: {exc}"] += 1
        if time.monotonic() > deadline:
            break
    ctrl.send(("ready", len(ready), dict(failures), time.monotonic() - started))
    try:
        result = count_deliveries(ready, ctrl, hard_deadline, subjects)
    finally:
        close_all(ready)
    ctrl.send(("result", result))
