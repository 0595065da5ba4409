"""TlsLink, the sans-I/O TLS of one client connection, driven with memory buffers."""

from __future__ import annotations

import contextlib
import ssl
import threading

import trustme

from migratory.server.tls_link import TlsLink


def _pair() -> tuple[TlsLink, ssl.SSLObject, ssl.MemoryBIO, ssl.MemoryBIO]:
    ca = trustme.CA()
    server_context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    ca.issue_cert("127.0.0.1").configure_cert(server_context)
    client_context = ssl.create_default_context()
    ca.configure_trust(client_context)
    to_server, to_client = ssl.MemoryBIO(), ssl.MemoryBIO()
    client = client_context.wrap_bio(to_client, to_server, server_hostname="127.0.0.1")
    return TlsLink(server_context), client, to_server, to_client


def _handshake(link: TlsLink, client: ssl.SSLObject, to_server: ssl.MemoryBIO,
               to_client: ssl.MemoryBIO) -> None:
    for _ in range(10):
        try:
            client.do_handshake()
            return
        except ssl.SSLWantReadError:
            link.receive(to_server.read())
            to_client.write(link.take_output())
    raise AssertionError("no handshake")


HANG_GUARD = 30.0  # s: an endless loop fails; a slow box does not


def _within(seconds: float, call: object) -> object:
    """``call()`` in a thread; fails if it does not return in time (an endless loop)."""
    result: list[object] = []
    thread = threading.Thread(target=lambda: result.append(call()), daemon=True)  # type: ignore[operator]
    thread.start()
    thread.join(seconds)
    assert not thread.is_alive(), "TlsLink.receive did not return"
    return result[0]


def test_application_data_goes_both_ways() -> None:
    link, client, to_server, to_client = _pair()
    _handshake(link, client, to_server, to_client)
    client.write(b"hello server")
    assert link.receive(to_server.read()) == b"hello server"
    link.encrypt(b"hello client")
    to_client.write(link.take_output())
    assert client.read() == b"hello client"


def test_a_close_notify_ends_the_session_without_spinning() -> None:
    """After the peer's close_notify, SSLObject.read() returns b"" for ever: the link
    must stop reading (it looped, and the whole server with it -- mosquitto_pub over
    TLS left a server that no longer answered anyone, not even SIGINT)."""
    link, client, to_server, to_client = _pair()
    _handshake(link, client, to_server, to_client)
    client.write(b"last words")
    with contextlib.suppress(ssl.SSLWantReadError):
        client.unwrap()  # sends close_notify
    assert _within(HANG_GUARD, lambda: link.receive(to_server.read())) == b"last words"
    assert link.closed  # the connection treats it as the TCP end
    assert _within(HANG_GUARD, lambda: link.receive(b"")) == b""  # then the TCP end


def test_seal_gives_what_waited_then_the_batch_in_one_piece() -> None:
    link, client, to_server, to_client = _pair()
    _handshake(link, client, to_server, to_client)
    client.write(b"hello server")
    assert link.receive(to_server.read()) == b"hello server"
    sealed = link.seal(b"first batch")  # after any record the server still had queued
    assert not link.has_output
    to_client.write(sealed)
    to_client.write(link.seal(b"second batch"))
    got = b""
    with contextlib.suppress(ssl.SSLWantReadError):
        while len(got) < len(b"first batchsecond batch"):
            got += client.read(65536)
    assert got == b"first batchsecond batch"


def test_our_end_is_a_close_notify_and_the_peers_answer_is_still_read() -> None:
    """The server's end over TLS: a ``close_notify`` before its FIN, so the client's TLS
    sees the stream end whole (before, only the FIN: a truncated stream). The client's
    records after it -- its close frame in answer -- are still read."""
    link, client, to_server, to_client = _pair()
    _handshake(link, client, to_server, to_client)
    assert link.receive(to_server.read()) == b""  # (the client's Finished: TLS 1.3)
    assert link.end()
    to_client.write(link.take_output())
    assert client.read() == b""  # (a close_notify read: b"", no SSLEOFError)
    client.write(b"my close frame")
    assert link.receive(to_server.read()) == b"my close frame"


def test_no_end_before_the_handshake() -> None:
    link, _client, _to_server, _to_client = _pair()
    assert not link.end()
    assert not link.has_output
