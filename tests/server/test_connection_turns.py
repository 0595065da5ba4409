"""A connection whose operations span several loop turns (connection.py,
OPERATIONS_PER_TURN) and that is aborted between two of them (a write failed) ends
quietly: the reader must not wait on the closed socket (chaos run, seed 3: ValueError
'file descriptor cannot be a negative integer' and BusyResourceError, closed 1011)."""

from __future__ import annotations

import logging
import socket

import pytest
import trio

from migratory.config import Config
from migratory.listeners import OPEN_LISTENER
from migratory.protocol import ops
from migratory.protocol import websocket as ws
from migratory.protocol.http import handshake_request, new_websocket_key
from migratory.server.app import Server
from migratory.server.connection import OPERATIONS_PER_TURN, Connection


def test_an_abort_between_two_turns_ends_the_reader_quietly(
    caplog: pytest.LogCaptureFixture,
) -> None:
    server = Server(Config.defaults())
    ours, theirs = socket.socketpair()
    ours.setblocking(False)
    connect = ws.encode_masked_binary(ops.encode_client_op(ops.Connect("c")), b"mask")
    pings = ws.encode_masked_binary(ops.encode_client_op(ops.Ping(1)), b"mask")
    theirs.sendall(handshake_request("127.0.0.1", "/", new_websocket_key()) + connect)

    async def main() -> None:
        async with trio.open_nursery() as nursery:
            server._nursery = nursery
            connection = Connection(server, ours, "127.0.0.1:1", OPEN_LISTENER)
            server.connections.add(connection)
            nursery.start_soon(connection.run)
            await trio.sleep(0.05)
            assert connection.session.connected
            read = server.ctx.stats.bytes_read
            theirs.sendall(pings * (OPERATIONS_PER_TURN * 4))  # four turns of work
            with trio.fail_after(2):
                while server.ctx.stats.bytes_read == read:  # the reader took them in
                    await trio.sleep(0)
            connection._abort()  # what a failed write does, between two turns
            with trio.fail_after(2):
                while connection in server.connections or not nursery.child_tasks:
                    await trio.sleep(0.01)
            await trio.sleep(0.1)
            nursery.cancel_scope.cancel()

    with caplog.at_level(logging.INFO):
        trio.run(main)
    theirs.close()
    assert "internal error" not in caplog.text, caplog.text
