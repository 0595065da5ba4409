"""The fan-out benchmark's publisher process: one raw WebSocket, stamped publishes on a schedule.

Message i is due at t0 + i/rate (no drift); the stamp is read just before the
send. With closures (the default) the ``PUBLISH_OK`` round trip is measured too.
"""

from __future__ import annotations

import contextlib
import multiprocessing.connection as mpc
import select
import signal
import time
from collections import Counter
from typing import Any

import cbor2
from _fanout_stamp import MARK, STAMP_END, subject_for
from _procfs import die_with_parent
from _wsraw import (
    OPCODE_CLOSE,
    RECV_SIZE,
    RawConn,
    close_all,
    close_code,
    masked,
    open_connections,
    walk_frames,
)


def publisher_main(
    ctrl: mpc.Connection,
    host: str,
    port: int,
    size: int,
    ack: bool,
    setup_timeout: float,
    subjects: int = 1,
) -> None:
    """Connect, report ready, publish on an absolute schedule when told to go."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    die_with_parent()
    connect = masked(cbor2.dumps({"op": "connect", "version": 1, "client": "bench-publisher"}))
    setup = open_connections(
        host, port, range(1), lambda _i: connect, ready_marker=b"connected", timeout=setup_timeout
    )
    ctrl.send(("ready", len(setup.ready), dict(setup.failures), setup.seconds))
    if not setup.ready or not ctrl.poll(setup_timeout + 60):
        return
    msg = ctrl.recv()
    if msg[0] != "go":
        return
    _, rate, duration, drain = msg
    try:
        result = publish(setup.ready[0], size, ack, rate, duration, drain, subjects)
    finally:
        close_all(setup.ready)
    ctrl.send(("done", result))


def publish(
    conn: RawConn,
    size: int,
    ack: bool,
    rate: float,
    duration: float,
    drain: float,
    subjects: int = 1,
) -> dict:
    sock = conn.sock
    subject_names = [subject_for(i, subjects) for i in range(subjects)]
    total = max(1, round(rate * duration))
    period_ns = 1e9 / rate
    padding = b"x" * (size - STAMP_END)
    ep = select.epoll()
    ep.register(sock.fileno(), select.EPOLLIN)
    out = bytearray()
    sent_at: dict[str, int] = {}
    acks: list[float] = []
    statuses: Counter[str] = Counter()
    pending = conn.buf
    late_max = 0
    late_sum = 0
    blocked_sends = 0
    hard_deadline = time.monotonic() + duration * 2 + 30
    t0 = time.monotonic_ns() + 1_000_000
    sent = 0

    def read_replies(timeout: float) -> None:
        nonlocal pending
        for _fd, _ev in ep.poll(timeout):
            try:
                data = sock.recv(RECV_SIZE)
            except BlockingIOError:
                continue
            if not data:
                statuses["connection closed"] += 1
                ep.unregister(sock.fileno())
                return
            now = time.monotonic_ns()
            data = pending + data
            frames, rest = walk_frames(data)
            pending = data[rest:]
            for opcode, start, end in frames:
                if opcode == OPCODE_CLOSE:
                    statuses[f"close frame {close_code(data, start, end)}"] += 1
                    continue
                reply = cbor2.loads(data[start:end])
                if reply.get("op") != "publish_status":
                    continue
                statuses[reply.get("status", "?")] += 1
                stamp = sent_at.pop(reply.get("closure", ""), None)
                if stamp is not None:
                    acks.append((now - stamp) / 1e6)

    while sent < total and time.monotonic() < hard_deadline:
        due = t0 + int(sent * period_ns)
        now = time.monotonic_ns()
        if now < due:
            read_replies((due - now) / 1e9)
            continue
        late = now - due
        late_sum += late
        late_max = max(late_max, late)
        op: dict[str, Any] = {
            "op": "publish",
            "subject": subject_names[sent % subjects],
            "content": MARK + b"%019d" % time.monotonic_ns() + padding,
        }
        if ack:
            closure = str(sent)
            op["closure"] = closure
        out += masked(cbor2.dumps(op))
        if ack:
            sent_at[closure] = time.monotonic_ns()
        with contextlib.suppress(BlockingIOError):
            del out[: sock.send(out)]
        if out:
            blocked_sends += 1
            select.select([], [sock], [], 1.0)
        sent += 1
    finished = time.monotonic_ns()
    while out and time.monotonic() < hard_deadline:
        select.select([], [sock], [], 1.0)
        with contextlib.suppress(BlockingIOError):
            del out[: sock.send(out)]
    drain_deadline = time.monotonic() + drain
    while ack and sent_at and time.monotonic() < drain_deadline:
        read_replies(0.05)
    ep.close()
    acks.sort()

    def q(p: float) -> float:
        return acks[min(len(acks) - 1, int(p * len(acks)))] if acks else float("nan")

    return {
        "sent": sent,
        "seconds": (finished - t0) / 1e9,
        "late_max_ms": late_max / 1e6,
        "late_mean_ms": late_sum / max(sent, 1) / 1e6,
        "blocked_sends": blocked_sends,
        "statuses": dict(statuses),
        "acks": len(acks),
        "ack_ms": {
            "p50": q(0.5),
            "p90": q(0.9),
            "p99": q(0.99),
            "max": acks[-1] if acks else float("nan"),
        },
    }
