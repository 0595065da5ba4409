"""TLS for the load processes' raw sockets, on memory buffers: one ``recv`` per wake-up.

An ``ssl.SSLSocket`` reads a record at a time from its socket (a read for the 5-byte
record header, another for the body), and returns one record's plaintext per call:
with the fan-out benchmark's small batches that is two system calls and a Python
``recv`` per delivery, on the same two cores as the server under test. Here the
socket is read like a plain one (everything available, one ``recv``), the bytes go
into an ``ssl.MemoryBIO`` and every complete record is decrypted from memory
(``ssl.SSLObject``, as the server's own ``TlsLink``); the subscriber counts stamps
in the plaintext exactly as in the clear. The handshake is blocking (connection
set-up), reading is non-blocking.
"""

from __future__ import annotations

import socket
import ssl
import time

READ_SIZE = 32768  # below malloc's mmap threshold, like the plain subscribers' recv


class TlsConn:
    """A connected socket with TLS on memory BIOs that reads like a plain socket:
    ``recv`` returns every byte of plaintext the records available carry, raises
    BlockingIOError when none is complete yet, and returns b"" when the peer closed."""

    __slots__ = ("_in", "_out", "_tls", "sock")

    def __init__(self, sock: socket.socket, context: ssl.SSLContext, server_hostname: str):
        self.sock = sock
        self._in = ssl.MemoryBIO()
        self._out = ssl.MemoryBIO()
        self._tls = context.wrap_bio(self._in, self._out, server_hostname=server_hostname)

    def fileno(self) -> int:
        return self.sock.fileno()

    def handshake(self, deadline: float) -> None:
        """Complete the TLS handshake on the (blocking) socket by ``deadline``."""
        while True:
            try:
                self._tls.do_handshake()
                break
            except ssl.SSLWantReadError:
                self._flush()
                self._fill(deadline)
        self._flush()

    def sendall(self, data: bytes) -> None:
        self._tls.write(data)
        self._flush()

    def recv_blocking(self, deadline: float) -> bytes:
        """Plaintext, waiting for at least one complete record (connection set-up)."""
        while True:
            try:
                return self._decrypt()
            except BlockingIOError:
                self._fill(deadline)

    def recv(self, size: int = READ_SIZE) -> bytes:
        """Everything decryptable now: one ``recv`` of the (non-blocking) socket, then
        the complete records in memory. ``size`` bounds the socket read."""
        try:
            data = self.sock.recv(size)
        except BlockingIOError:
            data = None
        if data is not None:
            if not data:
                return b""
            self._in.write(data)
        return self._decrypt()

    def _decrypt(self) -> bytes:
        """The plaintext of every complete record received; BlockingIOError if none."""
        tls = self._tls
        incoming = self._in
        chunks = []
        try:
            while True:
                chunk = tls.read(READ_SIZE)
                if not chunk:
                    break
                chunks.append(chunk)
                if not incoming.pending and not tls.pending():
                    break  # all used: skip the read that would raise SSLWantReadError
        except ssl.SSLWantReadError:
            pass
        except ssl.SSLZeroReturnError:  # close_notify: the peer is done
            if not chunks:
                return b""
        if not chunks:
            raise BlockingIOError
        return chunks[0] if len(chunks) == 1 else b"".join(chunks)

    def close(self) -> None:
        self.sock.close()

    def _flush(self) -> None:
        out = self._out.read()
        if out:
            self.sock.sendall(out)

    def _fill(self, deadline: float) -> None:
        self.sock.settimeout(max(0.01, deadline - time.monotonic()))
        data = self.sock.recv(READ_SIZE)
        if not data:
            raise ConnectionError("closed by the server during TLS set-up")
        self._in.write(data)


def tls_connect(
    host: str, port: int, context: ssl.SSLContext, deadline: float,
    server_hostname: str = "localhost",
) -> TlsConn:
    """A TCP connection with its TLS handshake done (the socket still blocking)."""
    sock = socket.create_connection((host, port), timeout=max(0.1, deadline - time.monotonic()))
    try:
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        conn = TlsConn(sock, context, server_hostname)
        conn.handshake(deadline)
    except BaseException:
        sock.close()
        raise
    return conn
