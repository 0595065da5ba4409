"""migratory_client.transport: URLs, connection errors, and a teardown that cannot hang."""

from __future__ import annotations

import functools
import socket
import ssl

import pytest
import trio
import trustme
from sdk_fake_server import trio_test
from sdk_raw_peer import RawPeer
from trio_websocket import HandshakeError, WebSocketConnection, WebSocketRequest, serve_websocket

from migratory.protocol import ops
from migratory_client.transport import (
    ClosedBeforeUpgrade,
    Endpoint,
    describe_connect_failure,
    run_connection,
)

OPTIONS = {"subprotocols": ["migratory.cbor"], "max_message_size": 2**20, "connect_timeout": 2.0}


def test_endpoint_of_urls() -> None:
    assert Endpoint.of("ws://127.0.0.1:8800") == Endpoint("127.0.0.1", 8800, "/", False)
    plain = Endpoint.of("ws://example.org/feed?x=1")
    assert (plain.port, plain.resource, plain.host_header) == (80, "/feed?x=1", "example.org")
    secure = Endpoint.of("wss://example.org:8443/")
    assert (secure.port, secure.secure, secure.host_header) == (8443, True, "example.org:8443")
    assert Endpoint.of("wss://example.org").port == 443


def test_an_ipv6_literal_is_bracketed_in_the_host_header() -> None:
    """``ws://[::1]:8800`` sent ``Host: ::1:8800`` (no host and port can be read from
    it), found by h172's review of the SDKs."""
    assert Endpoint.of("ws://[::1]:8800/").host_header == "[::1]:8800"
    assert Endpoint.of("wss://[2001:db8::7]/").host_header == "[2001:db8::7]"
    assert Endpoint.of("ws://[::1]:8800/").host == "::1"  # what the socket dials


@pytest.mark.parametrize("url", ["http://a:1", "ws://", "a:1"])
def test_endpoint_refuses_other_urls(url: str) -> None:
    with pytest.raises(ValueError, match="ws:// or wss://"):
        Endpoint.of(url)


@trio_test
async def test_a_rejected_upgrade_is_a_handshake_error() -> None:
    async def reject(request: WebSocketRequest) -> None:
        await request.reject(403, body=b"no")

    async with trio.open_nursery() as nursery:
        listener = await nursery.start(
            functools.partial(serve_websocket, reject, "127.0.0.1", 0, None)
        )

        async def never(ws: WebSocketConnection) -> None:
            raise AssertionError("no connection expected")

        with pytest.raises(HandshakeError):
            await run_connection(f"ws://127.0.0.1:{listener.port}", never, **OPTIONS)
        nursery.cancel_scope.cancel()


@trio_test
async def test_no_upgrade_answer_is_a_timeout() -> None:
    peer = RawPeer()  # accepts TCP, never answers the upgrade
    try:

        async def never(ws: WebSocketConnection) -> None:
            raise AssertionError("no connection expected")

        with pytest.raises(trio.TooSlowError):
            await run_connection(peer.url, never, **{**OPTIONS, "connect_timeout": 0.3})
    finally:
        peer.close()


@trio_test
async def test_the_connection_is_gone_when_serve_returns_though_a_frame_waits_unread() -> None:
    # The library's reader holds frames nobody reads and the peer has reset the
    # connection: with open_websocket_url this return never came (trio-websocket 0.12.2).
    peer = RawPeer()
    links = []

    async def accept() -> None:
        links.append(await peer.accept())

    async def serve(ws: WebSocketConnection) -> str:
        links[0].write_then_reset(*[ops.Pong(i) for i in range(5)])
        await ws.get_message()
        await trio.sleep(0.1)  # the reset has arrived
        with trio.move_on_after(1):
            await ws.aclose(1001, "bye")  # cannot write the close frame
        return "served"

    try:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(accept)
            with trio.fail_after(2):
                assert await run_connection(peer.url, serve, **OPTIONS) == "served"
    finally:
        peer.close()


async def never_served(ws: WebSocketConnection) -> None:
    raise AssertionError("no connection expected")


@trio_test
async def test_a_server_that_closes_without_answering_the_upgrade_is_told_at_once() -> None:
    """``ws://`` to a TLS port: the server reads the request and closes. Before, the
    wait for the upgrade's answer outlived the connection to ``connect_timeout``
    (trio.TooSlowError, ``migratory pub`` silent for 10 s, then "no server session")."""
    listener = socket.create_server(("127.0.0.1", 0))
    listener.setblocking(False)

    async def read_then_close() -> None:
        await trio.lowlevel.wait_readable(listener)
        connection, _ = listener.accept()
        with connection:
            await trio.lowlevel.wait_readable(connection)
            assert connection.recv(4096).startswith(b"GET / HTTP/1.1")

    url = f"ws://127.0.0.1:{listener.getsockname()[1]}"
    with listener:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(read_then_close)
            with pytest.raises(ClosedBeforeUpgrade) as caught:
                await run_connection(url, never_served, **{**OPTIONS, "connect_timeout": 30})
    assert describe_connect_failure(caught.value, url) == (
        "the server closed the connection without answering the WebSocket upgrade")


@trio_test
async def test_a_certificate_the_client_does_not_trust_is_named_at_once() -> None:
    """Before: the failed TLS handshake ended the library's reader silently and the
    attempt waited out ``connect_timeout``; the reason was never told."""
    cert = trustme.CA().issue_cert("127.0.0.1")
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    cert.configure_cert(context)

    async def handshake_only(stream: trio.SSLStream[trio.SocketStream]) -> None:
        with pytest.raises(trio.BrokenResourceError):
            await stream.do_handshake()

    async with trio.open_nursery() as nursery:
        (listener,) = await nursery.start(
            functools.partial(trio.serve_ssl_over_tcp, handshake_only, 0, context,
                              host="127.0.0.1"))
        url = f"wss://127.0.0.1:{listener.transport_listener.socket.getsockname()[1]}"
        with pytest.raises(ClosedBeforeUpgrade) as caught:
            await run_connection(url, never_served, **{**OPTIONS, "connect_timeout": 30})
        nursery.cancel_scope.cancel()
    assert describe_connect_failure(caught.value, url) == (
        "TLS: the server's certificate is not trusted: unable to get local issuer certificate")


@trio_test
async def test_a_refused_connection_says_refused() -> None:
    """Before: ``OSError('all attempts to connect to 127.0.0.1:N failed')``, its
    reasons dropped with trio's cause."""
    closed = socket.create_server(("127.0.0.1", 0))
    url = f"ws://127.0.0.1:{closed.getsockname()[1]}"
    closed.close()
    with pytest.raises(OSError) as caught:
        await run_connection(url, never_served, **OPTIONS)
    assert describe_connect_failure(caught.value, url) == (
        f"all attempts to connect to {url[5:]} failed: Connection refused")
