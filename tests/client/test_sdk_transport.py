"""migratory_client.transport: URLs, connection errors, and a teardown that cannot hang."""

from __future__ import annotations

import functools

import pytest
import trio
from sdk_fake_server import trio_test
from sdk_raw_peer import RawPeer
from trio_websocket import HandshakeError, WebSocketConnection, WebSocketRequest, serve_websocket

from migratory.protocol import ops
from migratory_client.transport import Endpoint, run_connection

OPTIONS = {"subprotocols": ["migratory.cbor"], "max_message_size": 2**20, "connect_timeout": 2.0}


def test_endpoint_of_urls() -> None:
    assert Endpoint.of("ws://127.0.0.1:8800") == Endpoint("127.0.0.1", 8800, "/", False)
    plain = Endpoint.of("ws://example.org/feed?x=1")
    assert (plain.port, plain.resource, plain.host_header) == (80, "/feed?x=1", "example.org")
    secure = Endpoint.of("wss://example.org:8443/")
    assert (secure.port, secure.secure, secure.host_header) == (8443, True, "example.org:8443")
    assert Endpoint.of("wss://example.org").port == 443


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
