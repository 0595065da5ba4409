"""Raw MQTT subscribers for the fan-out benchmark: non-blocking sockets, one epoll.

Each connection sends CONNECT and SUBSCRIBE (QoS 0, ``bench/fanout``) at once and is
ready when its SUBACK arrives; from then on the subscriber process counts stamps in
the byte stream exactly as for WebSocket subscribers (``count_deliveries``): the
PUBLISH packets are never decoded. Bounded by a deadline and by the number of
connections.
"""

from __future__ import annotations

import contextlib
import errno
import multiprocessing.connection as mpc
import select
import signal
import socket
import ssl
import time
from collections import Counter

from migratory.bench.procfs import die_with_parent, raise_nofile
from migratory.bench.stamp import subject_for
from migratory.bench.subscriber import count_deliveries
from migratory.bench.tlsraw import tls_connect
from migratory.bench.wsraw import RawConn, SetupResult, close_all, setup_read
from migratory.protocol import mqtt, mqtt_encode

SUBACK_HEADER = bytes((mqtt.SUBACK << 4, 3))


def first_packets(index: int, subjects: int) -> bytes:
    connect = mqtt.Connect(f"bench-{index}", clean_session=True, keep_alive=0)
    subscribe = mqtt.Subscribe(1, ((subject_for(index, subjects)[1:], 0),))
    return mqtt_encode.encode_packet(connect) + mqtt_encode.encode_packet(subscribe)


def open_mqtt_connections(
    host: str, port: int, indexes: range, *, timeout: float, subjects: int = 1,
    window: int = 256,
) -> SetupResult:
    """One MQTT connection per index, each ready once its SUBACK came back."""
    t0 = time.monotonic()
    deadline = t0 + timeout
    ep = select.epoll()
    live: dict[int, RawConn] = {}
    result = SetupResult(ready=[])
    todo = iter(indexes)
    exhausted = False

    def fail(conn: RawConn, why: str) -> None:
        result.failures[why] += 1
        live.pop(conn.sock.fileno(), None)
        with contextlib.suppress(OSError, ValueError):
            ep.unregister(conn.sock.fileno())
        conn.sock.close()

    def start_more() -> bool:
        while len(live) < window:
            index = next(todo, None)
            if index is None:
                return True
            sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            sock.setblocking(False)
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            code = sock.connect_ex((host, port))
            if code not in (0, errno.EINPROGRESS):
                result.failures[f"connect: {errno.errorcode.get(code, code)}"] += 1
                sock.close()
                continue
            live[sock.fileno()] = RawConn(index, sock, setup_ns=time.monotonic_ns())
            ep.register(sock.fileno(), select.EPOLLOUT)
        return False

    try:
        exhausted = start_more()
        while (live or not exhausted) and time.monotonic() < deadline:
            for fd, _mask in ep.poll(min(0.2, max(deadline - time.monotonic(), 0.0))):
                conn = live.get(fd)
                if conn is None:
                    continue
                if conn.state == "connecting":
                    err = conn.sock.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR)
                    if err:
                        fail(conn, f"connect: {errno.errorcode.get(err, err)}")
                        continue
                    conn.sock.send(first_packets(conn.index, subjects))
                    conn.state = "subscribing"
                    ep.modify(fd, select.EPOLLIN)
                    continue
                data = setup_read(conn, fail)
                if data is None:
                    continue
                at = data.find(SUBACK_HEADER)
                if at < 0:
                    conn.buf = data
                    continue
                if data[:4] != bytes((mqtt.CONNACK << 4, 2, 0, 0)):
                    fail(conn, f"CONNACK refused: {data[:4].hex()}")
                    continue
                conn.state = "ready"
                conn.ready_ns = time.monotonic_ns()
                conn.buf = data[at + 5 :]
                del live[fd]
                ep.unregister(fd)
                result.ready.append(conn)
            if not exhausted:
                exhausted = start_more()
        for conn in list(live.values()):
            fail(conn, f"timeout in {conn.state}")
        if not exhausted:
            result.failures["not attempted (timeout)"] += sum(1 for _ in todo)
    finally:
        ep.close()
    result.seconds = time.monotonic() - t0
    if result.ready:
        result.connect_ms_max = max(c.ready_ns - c.setup_ns for c in result.ready) / 1e6
    return result


def open_tls_connection(
    host: str, port: int, index: int, subjects: int, tls: ssl.SSLContext, deadline: float
) -> RawConn:
    """One MQTT connection over TLS (blocking until its SUBACK), then non-blocking."""
    conn = tls_connect(host, port, tls, deadline)
    try:
        conn.sendall(first_packets(index, subjects))
        buf = b""
        while (at := buf.find(SUBACK_HEADER)) < 0:
            data = conn.recv_blocking(deadline)
            if not data:
                raise ConnectionError("closed before SUBACK")
            buf += data
        if buf[:4] != bytes((mqtt.CONNACK << 4, 2, 0, 0)):
            raise ConnectionError(f"CONNACK refused: {buf[:4].hex()}")
        conn.sock.setblocking(False)
    except BaseException:
        conn.close()
        raise
    return RawConn(index, conn, state="ready", buf=buf[at + 5 :])  # type: ignore[arg-type]


def open_tls_connections(
    host: str, port: int, indexes: range, *, timeout: float, subjects: int, ca_file: str
) -> SetupResult:
    started = time.monotonic()
    deadline = started + timeout
    tls = ssl.create_default_context(cafile=ca_file)
    result = SetupResult(ready=[], failures=Counter())
    for index in indexes:
        try:
            result.ready.append(open_tls_connection(host, port, index, subjects, tls, deadline))
        except (OSError, ValueError) as exc:
            result.failures[f"setup: {exc}"] += 1
        if time.monotonic() > deadline:
            break
    result.seconds = time.monotonic() - started
    return result


def mqtt_subscriber_main(
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
    """As ``subscriber_main``, over MQTT (over TLS with ``ca_file``): open, report
    ready, count until told to finish."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    die_with_parent()
    raise_nofile()
    hard_deadline = time.monotonic() + lifetime
    indexes = range(first, first + count)
    if ca_file:
        setup = open_tls_connections(
            host, port, indexes, timeout=setup_timeout, subjects=subjects, ca_file=ca_file
        )
    else:
        setup = open_mqtt_connections(
            host, port, indexes, timeout=setup_timeout, subjects=subjects
        )
    ctrl.send(("ready", len(setup.ready), dict(setup.failures), setup.seconds))
    try:
        result = count_deliveries(setup.ready, ctrl, hard_deadline, subjects)
    finally:
        close_all(setup.ready)
    ctrl.send(("result", result))
