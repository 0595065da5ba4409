"""Cluster members in this process, on memory streams, for the trio SDK's reconnect
tests under ``trio.testing.MockClock``: the client's ``Endpoint.open_stream`` is
replaced, so every attempt reaches the member its URL names without a socket, and
minutes of back-off cost no wall time.

Each member is a function of the server's side of one connection (a
:class:`~sdk_fake_server.FakeConnection`, after the WebSocket upgrade), or one of
the ways of never giving a session: :data:`DOWN` (TCP refused), :data:`SILENT` (TCP
taken, never a word), :data:`UPGRADE_CLOSE` (the upgrade answered, the connection
dropped at once).
"""

from __future__ import annotations

import errno
from collections.abc import Awaitable, Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import pytest
import trio
import trio.testing
from sdk_fake_server import FakeConnection
from trio_websocket import wrap_server_stream

from migratory.protocol import close_codes, ops
from migratory_client import transport

Serve = Callable[[FakeConnection], Awaitable[None]]
DOWN = "down"
SILENT = "silent"
UPGRADE_CLOSE = "upgrade-close"
MAX_ATTEMPTS = 1000
"""More attempts than any test here makes (~30 in ten minutes of the default policy)."""


async def refuse_token(conn: FakeConnection) -> None:
    """Read ``connect``, close 4503 TOKEN_EXPIRED: whatever token came is refused."""
    await conn.expect(ops.Connect)
    await conn.close(close_codes.TOKEN_EXPIRED.code, "the token expired")


@dataclass
class Attempt:
    at: float
    url: str
    connect: ops.Connect | None = None


@dataclass
class MemoryMembers:
    """``members``: URL -> what that member does with each connection."""

    members: dict[str, Serve | str]
    nursery: trio.Nursery
    attempts: list[Attempt] = field(default_factory=list)
    held: list[trio.abc.Stream] = field(default_factory=list)

    async def open_stream(self, url: str) -> trio.abc.Stream:
        self.attempts.append(Attempt(trio.current_time(), url))
        if len(self.attempts) > MAX_ATTEMPTS:  # ends the client (and the test) at once
            raise AssertionError(f"a hot loop: {len(self.attempts)} attempts by {url}")
        member = self.members[url]
        if member == DOWN:
            raise OSError(errno.ECONNREFUSED, "Connection refused")
        client_end, server_end = trio.testing.memory_stream_pair()
        if member == SILENT:
            self.held.append(server_end)
        else:
            self.nursery.start_soon(self._serve, member, server_end, self.attempts[-1])
        return client_end

    async def _serve(self, member: Serve | str, stream: trio.abc.Stream, attempt: Attempt) -> None:
        async with trio.open_nursery() as nursery:
            request = await wrap_server_stream(nursery, stream)
            ws = await request.accept(subprotocol="migratory.cbor")
            if member == UPGRADE_CLOSE:
                await trio.aclose_forcefully(stream)
            else:
                assert callable(member)
                conn = RecordingConnection(ws, attempt)
                await member(conn)
            nursery.cancel_scope.cancel()

    def per_minute(self, until: float) -> list[int]:
        """Attempts in each whole minute of virtual time from 0 to ``until``."""
        counts = [0] * int(until // 60)
        for attempt in self.attempts:
            minute = int(attempt.at // 60)
            if minute < len(counts):
                counts[minute] += 1
        return counts


class RecordingConnection(FakeConnection):
    """Records the ``connect`` the client sent on its attempt."""

    def __init__(self, ws: Any, attempt: Attempt) -> None:
        super().__init__(ws)
        self._attempt = attempt

    async def receive(self) -> ops.ClientOp:
        op = await super().receive()
        if isinstance(op, ops.Connect):
            self._attempt.connect = op
        return op


@contextmanager
def memory_members(
    monkeypatch: pytest.MonkeyPatch, nursery: trio.Nursery, members: dict[str, Serve | str]
) -> Iterator[MemoryMembers]:
    """Route the client's connections to ``members`` for the block."""
    cluster = MemoryMembers(members, nursery)

    async def open_stream(endpoint: transport.Endpoint, tls: object = None) -> trio.abc.Stream:
        return await cluster.open_stream(f"ws://{endpoint.host}:{endpoint.port}")

    with monkeypatch.context() as patch:
        patch.setattr(transport.Endpoint, "open_stream", open_stream)
        yield cluster


def task_count() -> int:
    """Tasks alive in this trio run."""
    def count(task: trio.lowlevel.Task) -> int:
        return 1 + sum(count(child) for n in task.child_nurseries for child in n.child_tasks)

    return count(trio.lowlevel.current_root_task())
