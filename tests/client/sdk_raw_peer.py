"""A server peer for SDK tests at the byte level: a plain socket and migratory's own
sans-I/O codecs (HTTP upgrade, WebSocket frames, operations), no trio-websocket.

What the scripted fake server cannot do, this one can, deterministically: write several
frames and reset the TCP connection in one go, with no chance for the client to run in
between (:meth:`RawLink.write_then_reset`), or go silent -- read nothing, answer
nothing, close nothing -- like a peer behind a network that dropped the connection
without telling anyone. 127.0.0.1 only.
"""

from __future__ import annotations

import socket
import struct

import trio

from migratory.protocol import ops
from migratory.protocol import websocket as ws
from migratory.protocol.http import handshake_response
from migratory.protocol.http_server import RequestParser

ServerOp = ops.ServerOp


def frame(op: ServerOp) -> bytes:
    return ws.encode_binary(ops.encode_server_op(op))


def broken_frame() -> bytes:
    """A binary frame that is not an operation (the client must close with a code)."""
    return ws.encode_binary(b"\xff\x00 not cbor")


class RawPeer:
    """Listens on 127.0.0.1:<random port>; ``await peer.accept()`` per client connection."""

    def __init__(self) -> None:
        self._listener = socket.socket()
        self._listener.bind(("127.0.0.1", 0))
        self._listener.listen()
        self._listener.setblocking(False)
        self.url = f"ws://127.0.0.1:{self._listener.getsockname()[1]}"
        self.links: list[RawLink] = []

    async def accept(self) -> RawLink:
        """The next connection, after its WebSocket upgrade."""
        while True:
            await trio.lowlevel.wait_readable(self._listener)
            try:
                sock, _ = self._listener.accept()
            except BlockingIOError:
                continue
            sock.setblocking(False)
            link = RawLink(sock)
            self.links.append(link)
            await link.upgrade()
            return link

    def close(self) -> None:
        for link in self.links:
            link.close()
        self._listener.close()


class RawLink:
    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self._decoder = ws.FrameDecoder(client_frames=True)
        self._events: list[ws.Event] = []
        self.pings = 0

    async def _recv(self) -> bytes:
        while True:
            await trio.lowlevel.wait_readable(self.sock)
            try:
                return self.sock.recv(65536)
            except BlockingIOError:
                continue

    async def upgrade(self) -> None:
        parser = RequestParser()
        request = None
        while request is None:
            data = await self._recv()
            assert data, "client closed during the upgrade"
            request = parser.receive_data(data)
        self._write(handshake_response(request))
        self._events += self._decoder.events(parser.trailing)

    async def receive(self, *, answer_pings: bool = True) -> ops.ClientOp:
        """The next client operation; pings are answered (or only counted) on the way."""
        while True:
            while self._events:
                event = self._events.pop(0)
                if not isinstance(event, ws.BinaryMessage):
                    continue
                op = ops.decode_client_op(event.data)
                if isinstance(op, ops.Ping):
                    self.pings += 1
                    if answer_pings:
                        self.write(ops.Pong(op.id))
                    continue
                return op
            data = await self._recv()
            if not data:
                raise EOFError("the client closed the connection")
            self._events += self._decoder.events(data)

    async def closed_by_client(self) -> int | None:
        """Read on (operations are dropped) until the client's close frame; answer it, as a
        polite server does, and return its code."""
        while True:
            while self._events:
                event = self._events.pop(0)
                if isinstance(event, ws.CloseReceived):
                    self._write(ws.encode_close(event.code or 1000))
                    return event.code
            data = await self._recv()
            if not data:
                raise EOFError("the client closed the connection without a close frame")
            self._events += self._decoder.events(data)

    async def expect(self, kind: type[ops.ClientOp]) -> ops.ClientOp:
        op = await self.receive()
        assert isinstance(op, kind), f"expected {kind.__name__}, got {op!r}"
        return op

    async def accept_session(self, name: str = "raw") -> ops.Connect:
        connect = await self.expect(ops.Connect)
        assert isinstance(connect, ops.Connect)
        self.write(ops.Connected(name))
        return connect

    def write(self, *items: ServerOp | bytes) -> None:
        """Write operations (or ready frames) in one system call."""
        self._write(b"".join(i if isinstance(i, bytes) else frame(i) for i in items))

    def _write(self, data: bytes) -> None:
        self.sock.setblocking(True)  # small writes on loopback: never waits long
        try:
            self.sock.sendall(data)
        finally:
            self.sock.setblocking(False)

    def write_then_reset(self, *items: ServerOp | bytes) -> None:
        """Write, then reset the TCP connection (RST), with no checkpoint in between."""
        self.write(*items)
        self.reset()

    def reset(self) -> None:
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        self.sock.close()

    def close(self) -> None:
        self.sock.close()
