"""The fan-out benchmark's subscriber processes: many raw sockets in one epoll, counting stamps.

Each process opens its share of the subscribers, reports ``ready`` once every
one has seen ``SUBSCRIBE_ALLOW``, then buckets ``now - stamp`` for every
delivery until the parent sends ``finish`` (and the stragglers are drained).
"""

from __future__ import annotations

import multiprocessing.connection as mpc
import select
import signal
import time
from collections import Counter
from typing import Any

import cbor2

from migratory.bench.latency import BUCKET_NS, BUCKETS, sparse
from migratory.bench.procfs import die_with_parent, raise_nofile
from migratory.bench.stamp import expected_for, scan_stamps, subject_for
from migratory.bench.wsraw import (
    OPCODE_CLOSE,
    RECV_SIZE,
    RawConn,
    close_all,
    close_code,
    masked,
    open_connections,
    open_tls_connections,
)


def first_frames(index: int, subjects: int) -> bytes:
    """Subscriber ``index``'s ``connect`` and ``subscribe``, masked, sent after the 101."""
    connect = {"op": "connect", "version": 1, "client": f"bench-{index}"}
    subscribe = {"op": "subscribe", "subjects": [{"subject": subject_for(index, subjects)}]}
    return masked(cbor2.dumps(connect)) + masked(cbor2.dumps(subscribe))


def subscriber_main(
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
    """Open ``count`` subscribers (over TLS, verified with ``ca_file``, when given),
    report ready, count deliveries until told to finish."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the parent handles Ctrl-C and stops us
    die_with_parent()
    raise_nofile()
    hard_deadline = time.monotonic() + lifetime

    def frames_for(index: int) -> bytes:
        return first_frames(index, subjects)

    indexes = range(first, first + count)
    if ca_file:
        setup = open_tls_connections(host, port, indexes, frames_for,
                                     ready_marker=b"SUBSCRIBE_ALLOW", timeout=setup_timeout,
                                     ca_file=ca_file)
    else:
        setup = open_connections(host, port, indexes, frames_for,
                                 ready_marker=b"SUBSCRIBE_ALLOW", timeout=setup_timeout)
    ctrl.send(("ready", len(setup.ready), dict(setup.failures), setup.seconds))
    try:
        result = count_deliveries(setup.ready, ctrl, hard_deadline, subjects)
    finally:
        close_all(setup.ready)
    ctrl.send(("result", result))


def count_deliveries(
    conns: list[RawConn], ctrl: mpc.Connection, hard_deadline: float, subjects: int = 1
) -> dict[str, Any]:
    """The hot loop: recv, find the stamps, bucket latencies. No CBOR decoding.

    One C-level regex scan per ``recv`` (:func:`scan_stamps`) finds every
    stamp in the chunk, so a batch of several frames, or a frame carrying
    several messages, costs one call; it measured twice as fast as walking the
    frame headers in Python. A close frame is recognised from the last chunk
    when the connection ends.
    """
    ep = select.epoll()
    by_fd: dict[int, RawConn] = {}
    for conn in conns:
        by_fd[conn.sock.fileno()] = conn
        ep.register(conn.sock.fileno(), select.EPOLLIN)
    ctrl_fd = ctrl.fileno()
    ep.register(ctrl_fd, select.EPOLLIN)
    hist = [0] * BUCKETS
    top = BUCKETS - 1
    max_ns = 0
    total = 0
    closes: Counter[str] = Counter()
    expected_total: int | None = None
    sent = 0
    drain_until = hard_deadline
    open_conns = len(conns)
    recvs = 0
    polls = 0
    monotonic_ns = time.monotonic_ns
    scan = scan_stamps
    for conn in conns:  # bytes that followed SUBSCRIBE_ALLOW (none expected)
        stamps, conn.buf = scan(conn.buf)
        conn.count = len(stamps)
    try:
        while True:
            now_s = time.monotonic()
            if now_s >= hard_deadline:
                closes["load generator lifetime exceeded"] += 1
                break
            if expected_total is not None and (now_s >= drain_until or total >= expected_total):
                break
            events = ep.poll(0.05)
            polls += 1
            for fd, _ev in events:
                found = by_fd.get(fd)
                if found is None:
                    if fd == ctrl_fd:
                        msg = ctrl.recv()
                        if msg[0] == "finish":
                            sent = msg[1]
                            expected_total = sum(
                                expected_for(c.index, subjects, sent)
                                for c in conns
                                if c.sock.fileno() in by_fd
                            )
                            drain_until = min(time.monotonic() + msg[2], hard_deadline)
                    continue
                conn = found
                try:
                    data = conn.sock.recv(RECV_SIZE)
                except BlockingIOError:
                    continue
                except OSError as exc:
                    data = b""
                    conn.closed = f"recv error: {exc.strerror}"
                now = monotonic_ns()
                recvs += 1
                if not data:
                    closes[conn.closed or ended_with(conn.last)] += 1
                    ep.unregister(fd)
                    del by_fd[fd]
                    open_conns -= 1
                    continue
                stamps, conn.buf = scan(conn.buf + data if conn.buf else data)
                got = 0
                for stamp in stamps:
                    lat = now - int(stamp)
                    bucket = lat // BUCKET_NS
                    hist[bucket if bucket < top else top] += 1
                    if lat > max_ns:
                        max_ns = lat
                    got += 1
                conn.last = data
                conn.count += got
                total += got
    finally:
        ep.close()
    # received minus expected, per subscriber: 0 for every one when all arrived once
    per_conn = Counter(conn.count - expected_for(conn.index, subjects, sent) for conn in conns)
    return {
        "subscribers": len(conns),
        "received": total,
        "max_ns": max_ns,
        "hist": sparse(hist),
        "per_conn_delta": dict(per_conn),
        "closes": dict(closes),
        "recvs": recvs,
        "polls": polls,
    }


def ended_with(last: bytes) -> str:
    """How a connection ended, judging by the last bytes it received: a close frame or not."""
    for length in range(min(len(last) - 2, 125), -1, -1):
        start = len(last) - length
        if last[start - 2] == 0x80 | OPCODE_CLOSE and last[start - 1] == length:
            return f"close frame {close_code(last, start, len(last))}"
    return "closed without close frame"
