"""Raw WebSocket clients for the load processes: non-blocking sockets, one epoll, no library.

Nothing here uses asyncio, trio or a WebSocket library on the load side: the
clients are plain non-blocking sockets driven by ``select.epoll``, so that a
load process spends its CPU on ``recv`` and a few byte operations per frame.
The HTTP handshake and the (rare) client frames reuse the project's sans-I/O
codec; the hot paths in the benchmarks walk frame headers themselves.

Every loop here is bounded by a deadline (``time.monotonic``) and by the
number of connections it handles.
"""

from __future__ import annotations

import contextlib
import errno
import os
import select
import socket
import ssl
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import cbor2

from migratory.bench.tlsraw import tls_connect
from migratory.protocol.http import check_handshake_response, handshake_request, new_websocket_key
from migratory.protocol.websocket import encode_masked_binary

OPCODE_CLOSE = 0x8
RECV_SIZE = 32768  # below malloc's mmap threshold: a 256 KiB recv buffer costs an mmap per call


def walk_frames(data: bytes, pos: int = 0) -> tuple[list[tuple[int, int, int]], int]:
    """Complete server frames in ``data[pos:]`` as (opcode, payload start, payload end).

    Server frames are unmasked. Returns the frames and the offset where the
    first incomplete frame starts (== len(data) when everything was used).
    """
    frames = []
    n = len(data)
    while n - pos >= 2:
        length = data[pos + 1] & 0x7F
        start = pos + 2
        if length == 126:
            if n - pos < 4:
                break
            length = int.from_bytes(data[pos + 2 : pos + 4], "big")
            start = pos + 4
        elif length == 127:
            if n - pos < 10:
                break
            length = int.from_bytes(data[pos + 2 : pos + 10], "big")
            start = pos + 10
        end = start + length
        if end > n:
            break
        frames.append((data[pos] & 0x0F, start, end))
        pos = end
    return frames, pos


def close_code(data: bytes, start: int, end: int) -> int:
    """The code of a close frame's payload (1005 = none given)."""
    return int.from_bytes(data[start : start + 2], "big") if end - start >= 2 else 1005


@dataclass(slots=True, eq=False)
class RawConn:
    """One client socket and the little state a load process keeps for it."""

    index: int
    sock: socket.socket
    key: str = ""
    state: str = "connecting"
    buf: bytes = b""  # handshake bytes, then the start of an incomplete frame
    count: int = 0  # frames counted by the benchmark
    closed: str = ""  # why it ended ("" while open)
    setup_ns: int = 0  # monotonic_ns when the connection attempt started
    ready_ns: int = 0  # monotonic_ns when it saw the ready marker
    last: bytes = b""  # the last chunk received (to tell how the connection ended)


@dataclass
class SetupResult:
    ready: list[RawConn]
    failures: Counter[str] = field(default_factory=Counter)
    seconds: float = 0.0
    connect_ms_max: float = 0.0


def setup_read(conn: RawConn, fail: Callable[[RawConn, str], None]) -> bytes | None:
    """What arrived on a connection being set up, after what it already held; None when
    nothing did or it failed (``fail`` was told why)."""
    try:
        data = conn.sock.recv(65536)
    except BlockingIOError:
        return None
    except OSError as exc:
        fail(conn, f"{conn.state}: {exc.strerror}")
        return None
    if not data:
        fail(conn, f"{conn.state}: connection closed by server")
        return None
    return conn.buf + data


def open_connections(
    host: str,
    port: int,
    indexes: range,
    frames_for: Callable[[int], bytes],
    *,
    ready_marker: bytes,
    timeout: float,
    window: int = 256,
) -> SetupResult:
    """Open one WebSocket per index, send its first frames, wait for ``ready_marker``.

    ``frames_for(index)`` gives the (masked) frames connection ``index`` sends
    right after the 101. A connection is ready once a server frame contains
    ``ready_marker`` (e.g. ``b"SUBSCRIBE_ALLOW"``); bytes after that frame
    stay in ``conn.buf``. At most ``window`` connections are in their
    handshake at once (so the listen backlog never overflows). Bounded by
    ``timeout`` seconds and by ``len(indexes)`` connections.
    """
    t0 = time.monotonic()
    deadline = t0 + timeout
    ep = select.epoll()
    live: dict[int, RawConn] = {}
    result = SetupResult(ready=[])
    todo = iter(indexes)
    exhausted = False
    host_header = f"{host}:{port}"

    def fail(conn: RawConn, why: str) -> None:
        result.failures[why] += 1
        conn.closed = why
        fd = conn.sock.fileno()
        live.pop(fd, None)
        with contextlib.suppress(OSError, ValueError):
            ep.unregister(fd)
        conn.sock.close()

    def start_more() -> bool:
        while len(live) < window:
            index = next(todo, None)
            if index is None:
                return True
            sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            sock.setblocking(False)
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            conn = RawConn(index, sock, setup_ns=time.monotonic_ns())
            code = sock.connect_ex((host, port))
            if code not in (0, errno.EINPROGRESS):
                result.failures[f"connect: {errno.errorcode.get(code, code)}"] += 1
                sock.close()
                continue
            live[sock.fileno()] = conn
            ep.register(sock.fileno(), select.EPOLLOUT)
        return False

    try:
        exhausted = start_more()
        while (live or not exhausted) and time.monotonic() < deadline:
            events = ep.poll(min(0.2, max(deadline - time.monotonic(), 0.0)))
            for fd, _mask in events:
                conn = live.get(fd)
                if conn is None:
                    continue
                if conn.state == "connecting":
                    err = conn.sock.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR)
                    if err:
                        fail(conn, f"connect: {errno.errorcode.get(err, err)}")
                        continue
                    conn.key = new_websocket_key()
                    conn.sock.send(handshake_request(host_header, "/", conn.key))
                    conn.state = "handshake"
                    ep.modify(fd, select.EPOLLIN)
                    continue
                data = setup_read(conn, fail)
                if data is None:
                    continue
                conn.buf = b""
                if conn.state == "handshake":
                    try:
                        used = check_handshake_response(data, conn.key)
                    except Exception as exc:  # HttpError: the server refused
                        fail(conn, f"handshake: {exc}")
                        continue
                    if used is None:
                        conn.buf = data
                        continue
                    conn.sock.send(frames_for(conn.index))
                    conn.state = "ops"
                    data = data[used:]
                frames, rest = walk_frames(data)
                for opcode, start, end in frames:
                    if opcode == OPCODE_CLOSE:
                        fail(conn, f"closed by server with {close_code(data, start, end)}")
                        break
                    if data.find(ready_marker, start, end) >= 0:
                        conn.state = "ready"
                        conn.ready_ns = time.monotonic_ns()
                        conn.buf = data[end:]
                        del live[fd]
                        ep.unregister(fd)
                        result.ready.append(conn)
                        break
                else:
                    conn.buf = data[rest:]
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
    host: str,
    port: int,
    index: int,
    frames_for: Callable[[int], bytes],
    *,
    ready_marker: bytes,
    tls: ssl.SSLContext,
    deadline: float,
) -> RawConn:
    """One WebSocket over TLS (``wss://``), blocking until ``ready_marker`` arrived as in
    :func:`open_connections`, then non-blocking; its ``sock`` is a ``TlsConn``."""
    conn = tls_connect(host, port, tls, deadline)
    try:
        key = new_websocket_key()
        conn.sendall(handshake_request(f"{host}:{port}", "/", key))
        data = b""
        while (used := check_handshake_response(data, key)) is None:
            data += conn.recv_blocking(deadline)
        conn.sendall(frames_for(index))
        data = data[used:]
        while True:
            frames, _rest = walk_frames(data)
            for opcode, start, end in frames:
                if opcode == OPCODE_CLOSE:
                    raise ConnectionError(f"closed by server with {close_code(data, start, end)}")
                if data.find(ready_marker, start, end) >= 0:
                    conn.sock.setblocking(False)
                    return RawConn(index, conn, state="ready", buf=data[end:])  # type: ignore[arg-type]
            chunk = conn.recv_blocking(deadline)
            if not chunk:
                raise ConnectionError("closed by server before it was ready")
            data += chunk
    except BaseException:
        conn.close()
        raise


def open_tls_connections(
    host: str,
    port: int,
    indexes: range,
    frames_for: Callable[[int], bytes],
    *,
    ready_marker: bytes,
    timeout: float,
    ca_file: str,
) -> SetupResult:
    """:func:`open_connections` over TLS, one connection at a time."""
    started = time.monotonic()
    deadline = started + timeout
    tls = ssl.create_default_context(cafile=ca_file)
    result = SetupResult(ready=[])
    for index in indexes:
        try:
            result.ready.append(open_tls_connection(
                host, port, index, frames_for, ready_marker=ready_marker, tls=tls,
                deadline=deadline,
            ))
        except (OSError, ValueError) as exc:
            result.failures[f"setup: {exc}"] += 1
        if time.monotonic() > deadline:
            break
    result.seconds = time.monotonic() - started
    return result


def masked(payload: bytes) -> bytes:
    """One masked binary frame with a fresh random mask."""
    return encode_masked_binary(payload, os.urandom(4))


def close_all(conns: list[RawConn]) -> None:
    for conn in conns:
        with contextlib.suppress(OSError):
            conn.sock.close()


# --- a few blocking native sessions (cluster benchmarks), decoded replies -------------




def open_raw(
    port: int, client: str, timeout: float = 5.0, *, host: str = "127.0.0.1"
) -> tuple[socket.socket, bytes]:
    """One blocking native session: handshake + ``connect`` -> ``connected``; the socket
    and the bytes after ``connected``. For benchmarks with a few connections."""
    sock = socket.create_connection((host, port), timeout=timeout)
    try:
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        key = new_websocket_key()
        sock.sendall(handshake_request(f"{host}:{port}", "/", key))
        buf = b""
        deadline = time.monotonic() + timeout
        used = None
        while used is None:
            if time.monotonic() > deadline:
                raise TimeoutError("handshake timeout")
            chunk = sock.recv(65536)
            if not chunk:
                raise ConnectionError("closed during handshake")
            buf += chunk
            used = check_handshake_response(buf, key)
        buf = buf[used:]
        sock.sendall(masked(cbor2.dumps({"op": "connect", "version": 1, "client": client})))
        while time.monotonic() < deadline:
            frames, _rest = walk_frames(buf)
            for opcode, start, end in frames:
                if opcode == OPCODE_CLOSE:
                    raise ConnectionError(f"closed with {close_code(buf, start, end)}")
                if cbor2.loads(buf[start:end]).get("op") == "connected":
                    return sock, buf[end:]
            chunk = sock.recv(65536)
            if not chunk:
                raise ConnectionError("closed before connected")
            buf += chunk
        raise TimeoutError("no 'connected'")
    except BaseException:
        sock.close()
        raise


def publish_frame(subject: str, content: bytes, closure: str | None) -> bytes:
    """A native ``publish`` (with a closure: acknowledged), masked."""
    op: dict[str, Any] = {"op": "publish", "subject": subject, "content": content}
    if closure is not None:
        op["closure"] = closure
    return masked(cbor2.dumps(op))


def decode_frames(buf: bytes) -> tuple[list[Any], bytes]:
    """Decoded server ops in ``buf`` (close frames as ("close", code)), and the rest."""
    frames, rest = walk_frames(buf)
    out = []
    for opcode, start, end in frames:
        if opcode == OPCODE_CLOSE:
            out.append(("close", close_code(buf, start, end)))
        elif opcode in (0x1, 0x2):
            out.append(cbor2.loads(buf[start:end]))
    return out, buf[rest:]
