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
from migratory.bench.tlsraw import TlsConn, tls_connect
from migratory.bench.wsraw import RECV_SIZE, RawConn, close_all

READY = b"event:subscribe"


def stream_request(host: str, subject: str) -> bytes:
    """The ``GET /events`` of one subject's stream."""
    return f"GET /events?subject={subject} HTTP/1.1\r\nHost: {host}\r\n\r\n".encode()


def open_stream(
    host: str, port: int, subject: str, tls: ssl.SSLContext | None, deadline: float
) -> RawConn:
    request = stream_request(host, subject)
    if tls is not None:
        conn: socket.socket | TlsConn = tls_connect(host, port, tls, deadline)
    else:
        conn = socket.create_connection(
            (host, port), timeout=max(0.1, deadline - time.monotonic())
        )
        conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    try:
        conn.sendall(request)
        buf = b""
        while READY not in buf:
            data = (conn.recv_blocking(deadline) if isinstance(conn, TlsConn)
                    else conn.recv(RECV_SIZE))
            if not data:
                raise ConnectionError("closed before the subscribe event")
            buf += data
        end = buf.index(b"\n\n", buf.index(READY)) + 2
        (conn.sock if isinstance(conn, TlsConn) else conn).setblocking(False)
    except BaseException:
        conn.close()
        raise
    return RawConn(0, conn, state="open", buf=buf[end:])  # type: ignore[arg-type]


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
