"""A minimal async (trio) raw-protocol client for auditors and raw publishers: no SDK
logic at all.

It subscribes with the positions it is given, publishes what it is handed, and yields
every server operation as it arrives; liveness is a protocol ping every ``ping_every`` s
that must be answered within ``pong_timeout`` s (so a SIGSTOPped member is noticed).
Sends are serialised by a lock (a publisher sends while its reader answers pings).
"""

from __future__ import annotations

import os
from collections.abc import AsyncIterator
from typing import Any

import trio

from migratory.model.message import Message
from migratory.model.position import Position
from migratory.protocol import ops
from migratory.protocol import websocket as ws
from migratory.protocol.http import check_handshake_response, handshake_request, new_websocket_key


class RawSession:
    def __init__(self, stream: trio.SocketStream, decoder: ws.FrameDecoder) -> None:
        self.stream, self.decoder = stream, decoder
        self.pings = 0
        self._sending = trio.Lock()

    @classmethod
    async def open(cls, port: int, name: str) -> RawSession:
        stream = await trio.open_tcp_stream("127.0.0.1", port)
        try:
            decoder = ws.FrameDecoder(client_frames=False, max_message_size=64 << 20)
            key = new_websocket_key()
            await stream.send_all(handshake_request("127.0.0.1", "/", key))
            buf = b""
            for _ in range(10_000):
                chunk = await stream.receive_some(65536)
                if not chunk:
                    raise ConnectionError("closed during handshake")
                buf += chunk
                used = check_handshake_response(buf, key)
                if used is not None:
                    decoder.receive_data(buf[used:])
                    break
            session = cls(stream, decoder)
            await session.send(ops.Connect(client=name))
            reply = await session.recv_op()
            if not isinstance(reply, ops.Connected):
                raise ConnectionError(f"expected CONNECTED, got {reply!r}")
            return session
        except BaseException:
            await trio.aclose_forcefully(stream)
            raise

    async def __aenter__(self) -> RawSession:
        return self

    async def __aexit__(self, *exc: Any) -> None:
        await trio.aclose_forcefully(self.stream)

    async def send(self, op: ops.ClientOp) -> None:
        await self._send_bytes(ws.encode_masked_binary(ops.encode_client_op(op), os.urandom(4)))

    async def _send_bytes(self, data: bytes) -> None:
        async with self._sending:
            await self.stream.send_all(data)

    async def subscribe(
        self, subjects: list[tuple[str, tuple[int, int] | None]], *, history: int = 0
    ) -> None:
        """Subscribe each subject from its position; ``history`` for those without one."""
        requests = tuple(
            ops.SubscriptionRequest(s, Position(*p) if p else None, 0 if p else history)
            for s, p in subjects
        )
        await self.send(ops.Subscribe(requests))

    async def publish(self, message: Message) -> None:
        await self.send(ops.Publish(message))

    async def recv_op(self) -> ops.ServerOp:
        while True:
            event = self.decoder.next_event()
            if event is None:
                chunk = await self.stream.receive_some(65536)
                if not chunk:
                    raise ConnectionError("server closed the TCP connection")
                self.decoder.receive_data(chunk)
                continue
            if isinstance(event, ws.BinaryMessage):
                op = ops.decode_server_op(event.data)
                if isinstance(op, ops.UnknownOp):  # this server speaks only known ones
                    raise ConnectionError(f"server sent an unknown op {op.name!r}")
                return op
            if isinstance(event, ws.CloseReceived):
                raise ConnectionError(f"server closed: {event.code} {event.reason}")
            if isinstance(event, ws.Ping):
                await self._send_bytes(ws.encode_pong(event.payload, mask=os.urandom(4)))

    async def ops(self, *, ping_every: float, pong_timeout: float) -> AsyncIterator[ops.ServerOp]:
        last_heard = trio.current_time()
        next_ping = last_heard + ping_every
        while True:
            now = trio.current_time()
            if now - last_heard > ping_every + pong_timeout:
                raise trio.TooSlowError(f"no answer for {now - last_heard:.1f} s")
            if now >= next_ping:
                self.pings += 1
                await self.send(ops.Ping(self.pings))
                next_ping = now + ping_every
            with trio.move_on_after(max(0.05, next_ping - now)):
                op = await self.recv_op()
                last_heard = trio.current_time()
                if not isinstance(op, ops.Pong):
                    yield op
