"""The publisher process: one raw connection, stamped publishes on an absolute schedule.

Message i is due at t0 + i/rate (no drift); the stamp is read just before the
send. Natively a publish with a closure gets a ``publish_status`` back; over
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
from collections.abc import Callable
from typing import Any

import cbor2

from migratory.bench.latency import BUCKET_NS, BUCKETS, percentiles_ms, sparse
from migratory.bench.procfs import die_with_parent
from migratory.bench.stamp import MARK, STAMP_END, subject_for
from migratory.bench.wsraw import (
    OPCODE_CLOSE,
    RECV_SIZE,
    close_code,
    masked,
    open_connections,
    publish_frame,
    walk_frames,
)
from migratory.protocol import mqtt, mqtt_encode

ACK_QUANTILES = (0.5, 0.9, 0.99, 0.999)
PUBACK = mqtt.PUBACK << 4
ACCEPTED = frozenset({"PUBLISH_OK", "PUBACK"})  # the acknowledgements whose latency counts

# (content, message index) -> (bytes to send, key of the acknowledgement or None)
Encoder = Callable[[bytes, int], tuple[bytes, Any]]
# received bytes -> ([(status, key)], bytes to keep for the next chunk)
ReplyReader = Callable[[bytes], tuple[list[tuple[str, Any]], bytes]]


def native_wire(subjects: int, ack: bool) -> tuple[Encoder, ReplyReader]:
    names = [subject_for(i, subjects) for i in range(subjects)]

    def encode(content: bytes, i: int) -> tuple[bytes, Any]:
        closure = str(i) if ack else None
        return publish_frame(names[i % subjects], content, closure), closure

    def replies(data: bytes) -> tuple[list[tuple[str, Any]], bytes]:
        frames, rest = walk_frames(data)
        out: list[tuple[str, Any]] = []
        for opcode, start, end in frames:
            if opcode == OPCODE_CLOSE:
                out.append((f"close frame {close_code(data, start, end)}", None))
                continue
            reply = cbor2.loads(data[start:end])
            if reply.get("op") == "publish_status":
                status = reply.get("status", "?")
                if status != "PUBLISH_OK" and reply.get("reason"):
                    status = f"{status}: {reply['reason']}"
                out.append((status, reply.get("closure")))
        return out, data[rest:]

    return encode, replies


def mqtt_wire(subjects: int, ack: bool) -> tuple[Encoder, ReplyReader]:
    topics = [mqtt_encode.publish_parts(subject_for(i, subjects)[1:], b"")[0]
              for i in range(subjects)]

    def encode(content: bytes, i: int) -> tuple[bytes, Any]:
        packet_id = i % 65535 + 1 if ack else None
        frame = mqtt_encode.encode_publish_from_parts(
            topics[i % subjects], content, qos=1 if ack else 0, retain=False,
            packet_id=packet_id,
        )
        return frame, packet_id

    def replies(data: bytes) -> tuple[list[tuple[str, Any]], bytes]:
        out: list[tuple[str, Any]] = []
        pos = 0
        while len(data) - pos >= 2:
            length = data[pos + 1]
            if length & 0x80:  # a broker sends us only short packets; stop on anything else
                out.append((f"unexpected packet {data[pos]:#x}", None))
                return out, b""
            if len(data) - pos < 2 + length:
                break
            if data[pos] == PUBACK and length == 2:
                out.append(("PUBACK", int.from_bytes(data[pos + 2 : pos + 4], "big")))
            pos += 2 + length
        return out, data[pos:]

    return encode, replies


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
        wire = mqtt_wire(subjects, ack)
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
        wire = native_wire(subjects, ack)
    try:
        if not ctrl.poll(setup_timeout + 60):
            return
        msg = ctrl.recv()
        if msg[0] != "go":
            return
        _, rate, duration, drain = msg
        result = publish(sock, pending, wire, size, ack, rate, duration, drain)
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
        return publish(conn.sock, conn.buf, native_wire(subjects, True), size, True, rate,
                       duration, drain)
    finally:
        conn.sock.close()


def publish(
    sock: socket.socket,
    pending: bytes,
    wire: tuple[Encoder, ReplyReader],
    size: int,
    ack: bool,
    rate: float,
    duration: float,
    drain: float,
) -> dict[str, Any]:
    encode, replies = wire
    total = max(1, round(rate * duration))
    period_ns = 1e9 / rate
    padding = b"x" * (size - STAMP_END)
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

    while sent < total and time.monotonic() < hard_deadline:
        due = t0 + int(sent * period_ns)
        now = time.monotonic_ns()
        if now < due:
            read_replies((due - now) / 1e9)
            continue
        late = now - due
        late_sum += late
        late_max = max(late_max, late)
        frame, key = encode(MARK + b"%019d" % time.monotonic_ns() + padding, sent)
        out += frame
        if key is not None:
            sent_at[key] = time.monotonic_ns()
        with contextlib.suppress(BlockingIOError):
            del out[: sock.send(out)]
        if out:
            blocked_sends += 1
            wait_writable()
        elif sent % 64 == 0:  # behind schedule it never waits: read the replies anyway
            read_replies(0)
        sent += 1
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
