"""A scripted fake server for SDK tests: trio-websocket on 127.0.0.1 + the ops codec.

Each accepted connection is handed to the test as a :class:`FakeConnection`; the
test decides what the server says, when it closes (with a code) or drops the TCP
connection without a close frame.
"""

from __future__ import annotations

import functools
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

import trio
from trio_websocket import ConnectionClosed, WebSocketConnection, WebSocketRequest, serve_websocket

from migratory.model.message import Message, MessageType
from migratory.model.position import Position
from migratory.protocol import ops
from migratory_client import ReconnectPolicy

T = TypeVar("T")
TEST_TIMEOUT = 60.0
"""A hang guard only, never a claim about speed: a test that needs more on a loaded box
(real server processes start in 1-10 s there) is slow, not wrong."""


def trio_test(fn: Callable[..., Awaitable[None]]) -> Callable[..., None]:
    """Run an async test under trio.run with a hang guard (:data:`TEST_TIMEOUT`)."""

    @functools.wraps(fn)
    def run(*args: Any, **kwargs: Any) -> None:
        async def main() -> None:
            with trio.fail_after(TEST_TIMEOUT):
                await fn(*args, **kwargs)

        trio.run(main)

    return run


def update(
    subject: str, seq: int, epoch: int = 7, kind: MessageType = MessageType.UPDATE
) -> Message:
    return Message(subject, f"{subject}#{seq}".encode(), epoch=epoch, seq=seq, type=kind)


class FakeConnection:
    def __init__(self, ws: WebSocketConnection) -> None:
        self.ws = ws
        self.released = trio.Event()
        self.auto_pong = True

    async def receive(self) -> ops.ClientOp:
        """The next client operation, answering pings on the way if ``auto_pong``."""
        while True:
            payload = await self.ws.get_message()
            assert isinstance(payload, bytes)
            op = ops.decode_client_op(payload)
            if isinstance(op, ops.Ping):
                if self.auto_pong:
                    await self.send(ops.Pong(op.id))
                continue
            return op

    async def expect(self, kind: type[T]) -> T:
        op = await self.receive()
        assert isinstance(op, kind), f"expected {kind.__name__}, got {op!r}"
        return op

    async def send(self, *server_ops: ops.ServerOp) -> None:
        for op in server_ops:
            await self.ws.send_message(ops.encode_server_op(op))

    async def accept_session(self, name: str = "fake") -> ops.Connect:
        connect = await self.expect(ops.Connect)
        await self.send(ops.Connected(name))
        return connect

    async def allow(self, subject: str, epoch: int, seq: int) -> None:
        await self.send(
            ops.SubjectStatus(ops.Status.SUBSCRIBE_ALLOW, subject, Position(epoch, seq))
        )

    async def deliver(self, *messages: Message) -> None:
        await self.send(ops.Deliver(messages))

    async def close(self, code: int, reason: str = "") -> None:
        await self.ws.aclose(code, reason)
        self.released.set()

    async def drop(self) -> None:
        """Lose the connection without a close frame (like a crashed server)."""
        await self.ws._stream.aclose()  # test-only: reach under trio-websocket
        self.released.set()

    async def closed_by_client(self) -> int:
        """Wait until the client closes; returns the close code."""
        try:
            while True:
                await self.receive()
        except ConnectionClosed as exc:
            self.released.set()
            return exc.reason.code if exc.reason is not None else 1006


class FakeServer:
    """Serves on 127.0.0.1:<random port>; ``await server.next_connection()`` per client."""

    def __init__(self, max_message_size: int = 2**20) -> None:
        self._send, self._receive = trio.open_memory_channel[FakeConnection](10)
        self._max_message_size = max_message_size
        self.url = ""
        self.accepted = 0

    async def start(self, nursery: trio.Nursery) -> FakeServer:
        listener = await nursery.start(
            functools.partial(
                serve_websocket,
                self._handle,
                "127.0.0.1",
                0,
                None,
                max_message_size=self._max_message_size,
            )
        )
        self.url = f"ws://127.0.0.1:{listener.port}"
        return self

    async def _handle(self, request: WebSocketRequest) -> None:
        subprotocol = "migratory.cbor" if request.proposed_subprotocols else None
        ws = await request.accept(subprotocol=subprotocol)
        self.accepted += 1
        connection = FakeConnection(ws)
        await self._send.send(connection)
        await connection.released.wait()

    async def next_connection(self) -> FakeConnection:
        return await self._receive.receive()


async def start_servers(nursery: trio.Nursery, count: int = 1) -> list[FakeServer]:
    return [await FakeServer().start(nursery) for _ in range(count)]


FAST = ReconnectPolicy(initial_delay=0.02, max_delay=0.1, connect_timeout=2.0)
"""The reconnect policy of these tests: retries in tens of milliseconds."""


async def subscribed_at(
    server: FakeServer, client: Any, subject: str, epoch: int, seq: int
) -> tuple[Any, FakeConnection]:
    """``client`` subscribes to ``subject``; the server's next connection takes the
    session and allows the subject at ``(epoch, seq)``: (subscription, connection)."""
    subscription = client.subscribe(subject)
    conn = await server.next_connection()
    await conn.accept_session()
    await conn.expect(ops.Subscribe)
    await conn.allow(subject, epoch, seq)
    return subscription, conn
