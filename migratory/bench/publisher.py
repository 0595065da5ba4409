"""The publisher process: one raw connection, stamped publishes on an absolute schedule.

Message i is due at t0 + i/rate (no drift); every message due is written
into one buffer, each stamped as it is (``migratory.bench.publish_wire``: a
pre-encoded frame per subject, the stamp written in), and the buffer goes out
in one ``send``. Natively a publish with a closure gets a ``publish_status`` back; over
MQTT a QoS 1 PUBLISH gets a PUBACK. With acknowledgements on (the default) the
round trip of each is measured into a 0.1 ms histogram.
"""

from __future__ import annotations

import contextlib
import multiprocessing.connection as mpc
import select
import signal
import socket
import time
from collections import Counter
from typing import Any

import cbor2

from migratory.bench.latency import BUCKET_NS, BUCKETS, percentiles_ms, sparse
from migratory.bench.procfs import die_with_parent
from migratory.bench.publish_wire import Encoder, ReplyReader, mqtt_wire, native_wire
from migratory.bench.wsraw import RECV_SIZE, masked, open_connections
from migratory.protocol import mqtt, mqtt_encode

ACK_QUANTILES = (0.5, 0.9, 0.99, 0.999)
BURST_BYTES = 64 * 1024  # the most written at once when behind schedule
ACCEPTED = frozenset({"PUBLISH_OK", "PUBACK"})  # the acknowledgements whose latency counts


def connect_mqtt(host: str, port: int, timeout: float) -> tuple[socket.socket, bytes]:
    """A blocking MQTT CONNECT / CONNACK, then a non-blocking socket."""
    sock = socket.create_connection((host, port), timeout=timeout)
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    sock.sendall(mqtt_encode.encode_packet(mqtt.Connect("bench-publisher", keep_alive=0)))
    buf = b""
    while len(buf) < 4:
        data = sock.recv(4096)
        if not data:
            raise ConnectionError("closed before CONNACK")
        buf += data
    if buf[:4] != bytes((mqtt.CONNACK << 4, 2, 0, 0)):
        raise ConnectionError(f"CONNACK refused: {buf[:4].hex()}")
    sock.setblocking(False)
    return sock, buf[4:]


def publisher_main(
    ctrl: mpc.Connection,
    host: str,
    port: int,
    size: int,
    ack: bool,
    setup_timeout: float,
    subjects: int = 1,
    protocol: str = "native",
) -> None:
    """Connect, report ready, publish on an absolute schedule when told to go."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    die_with_parent()
    if protocol == "mqtt":
        try:
            sock, pending = connect_mqtt(host, port, setup_timeout)
        except OSError as exc:
            ctrl.send(("ready", 0, {f"mqtt connect: {exc}": 1}, 0.0))
            return
        socks = [sock]
        ctrl.send(("ready", 1, {}, 0.0))
        wire = mqtt_wire(subjects, ack, size)
    else:
        hello = masked(cbor2.dumps({"op": "connect", "version": 1, "client": "bench-publisher"}))
        setup = open_connections(
            host, port, range(1), lambda _i: hello, ready_marker=b"connected",
            timeout=setup_timeout,
        )
        ctrl.send(("ready", len(setup.ready), dict(setup.failures), setup.seconds))
        if not setup.ready:
            return
        sock, pending = setup.ready[0].sock, setup.ready[0].buf
        socks = [sock]
        wire = native_wire(subjects, ack, size)
    try:
        if not ctrl.poll(setup_timeout + 60):
            return
        msg = ctrl.recv()
        if msg[0] != "go":
            return
        _, rate, duration, drain = msg
        result = publish(sock, pending, wire, ack, rate, duration, drain)
    finally:
        for s in socks:
            with contextlib.suppress(OSError):
                s.close()
    ctrl.send(("done", result))


def publish_paced(
    host: str,
    port: int,
    *,
    rate: float,
    duration: float,
    size: int,
    subjects: int = 1,
    drain: float = 10.0,
    setup_timeout: float = 10.0,
) -> dict[str, Any]:
    """In this process: one native connection, acknowledged publishes at ``rate``.

    For benchmarks that drive a server they started themselves (a cluster member).
    """
    hello = masked(cbor2.dumps({"op": "connect", "version": 1, "client": "bench-publisher"}))
    setup = open_connections(
        host, port, range(1), lambda _i: hello, ready_marker=b"connected", timeout=setup_timeout
    )
    if not setup.ready:
        raise RuntimeError(f"publisher could not connect: {dict(setup.failures)}")
    conn = setup.ready[0]
    try:
        return publish(conn.sock, conn.buf, native_wire(subjects, True, size), True, rate,
                       duration, drain)
    finally:
        conn.sock.close()


def publish(
    sock: socket.socket,
    pending: bytes,
    wire: tuple[Encoder, ReplyReader],
    ack: bool,
    rate: float,
    duration: float,
    drain: float,
) -> dict[str, Any]:
    encode, replies = wire
    total = max(1, round(rate * duration))
    period_ns = 1e9 / rate
    ep = select.epoll()
    ep.register(sock.fileno(), select.EPOLLIN)
    out = bytearray()
    sent_at: dict[Any, int] = {}
    ack_hist = [0] * BUCKETS
    ack_max_ns = 0
    acks = 0
    statuses: Counter[str] = Counter()
    late_max = 0
    late_sum = 0
    blocked_sends = 0
    hard_deadline = time.monotonic() + duration * 2 + 30
    t0 = time.monotonic_ns() + 1_000_000
    sent = 0

    def read_replies(timeout: float) -> None:
        nonlocal pending, acks, ack_max_ns
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
            found, pending = replies(pending + data)
            for status, key in found:
                statuses[status] += 1
                stamp = sent_at.pop(key, None)
                if stamp is not None and status in ACCEPTED:
                    lat = now - stamp
                    ack_hist[min(lat // BUCKET_NS, BUCKETS - 1)] += 1
                    ack_max_ns = max(ack_max_ns, lat)
                    acks += 1

    def wait_writable() -> None:
        """Until the socket takes more, reading replies meanwhile: a publisher that stops
        reading while the server waits for it to read is cut off as a slow consumer."""
        readable, _, _ = select.select([sock], [sock], [], 1.0)
        if readable:
            read_replies(0)

    monotonic_ns = time.monotonic_ns
    writes = 0
    while sent < total and time.monotonic() < hard_deadline:
        due = t0 + int(sent * period_ns)
        now = monotonic_ns()
        if now < due:
            read_replies((due - now) / 1e9)
            continue
        # every message due by now, in one write (each stamped as it is written)
        while True:
            late = now - due
            late_sum += late
            late_max = max(late_max, late)
            key = encode(out, sent, monotonic_ns())
            if key is not None:
                sent_at[key] = monotonic_ns()
            sent += 1
            if sent >= total or len(out) >= BURST_BYTES:
                break
            due = t0 + int(sent * period_ns)
            now = monotonic_ns()
            if now < due:
                break
        with contextlib.suppress(BlockingIOError):
            del out[: sock.send(out)]
        if out:
            blocked_sends += 1
            wait_writable()
        else:
            writes += 1
            if writes % 16 == 0:  # behind schedule it never waits: read the replies anyway
                read_replies(0)
    finished = time.monotonic_ns()
    while out and time.monotonic() < hard_deadline:
        wait_writable()
        with contextlib.suppress(BlockingIOError):
            del out[: sock.send(out)]
    drain_deadline = time.monotonic() + drain
    while ack and sent_at and time.monotonic() < drain_deadline:
        read_replies(0.05)
    ep.close()
    ack_ms = percentiles_ms(ack_hist, ACK_QUANTILES)
    ack_ms = {k: min(v, ack_max_ns / 1e6) for k, v in ack_ms.items()}  # a bucket's upper edge
    ack_ms["max"] = ack_max_ns / 1e6 if acks else float("nan")
    return {
        "sent": sent,
        "seconds": (finished - t0) / 1e9,
        "late_max_ms": late_max / 1e6,
        "late_mean_ms": late_sum / max(sent, 1) / 1e6,
        "blocked_sends": blocked_sends,
        "statuses": dict(statuses),
        "acks": acks,  # acknowledged with PUBLISH_OK / PUBACK
        "unanswered": len(sent_at),
        "ack_ms": ack_ms,
        "ack_hist": sparse(ack_hist),
    }
