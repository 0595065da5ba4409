"""The load processes' TLS reader (migratory/bench/tlsraw.py) against a real TLS server
socket on 127.0.0.1: every record that arrived is decrypted by one ``recv``, a partial
record waits, the peer's close reads as b""."""

from __future__ import annotations

import socket
import ssl
import threading
import time
from collections.abc import Iterator

import pytest
import trustme

from migratory.bench.tlsraw import TlsConn, tls_connect

Pair = tuple[TlsConn, ssl.SSLSocket]


@pytest.fixture
def tls_pair() -> Iterator[Pair]:
    """A TlsConn (client, non-blocking after the handshake) and the server's SSLSocket."""
    ca = trustme.CA()
    server_ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    ca.issue_cert("localhost").configure_cert(server_ctx)
    client_ctx = ssl.create_default_context()
    ca.configure_trust(client_ctx)
    listener = socket.create_server(("127.0.0.1", 0))
    accepted: list[ssl.SSLSocket] = []

    def accept() -> None:
        raw, _ = listener.accept()
        accepted.append(server_ctx.wrap_socket(raw, server_side=True))

    thread = threading.Thread(target=accept, daemon=True)
    thread.start()
    client = tls_connect("127.0.0.1", listener.getsockname()[1], client_ctx,
                         time.monotonic() + 10)
    thread.join(10)
    (server,) = accepted
    client.sock.setblocking(False)
    try:
        yield client, server
    finally:
        client.close()
        server.close()
        listener.close()


def read_within(client: TlsConn, seconds: float = 5.0) -> bytes:
    """The first non-empty ``recv`` (the server's bytes may take a moment)."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        try:
            return client.recv()
        except BlockingIOError:
            time.sleep(0.01)
    raise AssertionError("nothing decrypted in time")


def test_one_recv_returns_every_record_that_arrived(tls_pair: Pair) -> None:
    client, server = tls_pair
    for i in range(5):  # five writes: five TLS records
        server.sendall(b"record %d;" % i)
    time.sleep(0.2)  # all five are in the client's socket buffer
    assert client.recv() == b"".join(b"record %d;" % i for i in range(5))
    with pytest.raises(BlockingIOError):
        client.recv()


def test_a_partial_record_waits_for_its_end(tls_pair: Pair) -> None:
    client, server = tls_pair
    server.sendall(b"x" * 1000)
    time.sleep(0.2)
    data = client.sock.recv(65536)  # the record's ciphertext, taken off the socket raw
    client._in.write(data[:100])  # type: ignore[attr-defined]  # only its start
    with pytest.raises(BlockingIOError):
        client.recv()
    client._in.write(data[100:])  # type: ignore[attr-defined]
    assert client.recv() == b"x" * 1000


def test_the_servers_close_reads_as_end_of_stream(tls_pair: Pair) -> None:
    client, server = tls_pair
    server.sendall(b"last")
    assert read_within(client) == b"last"
    server.close()
    deadline = time.monotonic() + 5
    got = None
    while time.monotonic() < deadline:
        try:
            got = client.recv()
            break
        except BlockingIOError:
            time.sleep(0.01)
    assert got == b""
