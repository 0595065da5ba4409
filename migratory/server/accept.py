"""trio's ``serve_tcp`` / ``serve_listeners``, with the descriptor exhaustion said once.

The same loop as trio's (one task per listener, a handler task per connection closed
with ``aclose_forcefully`` after it, other ``OSError`` of ``accept`` raised), except
that an ``accept`` refused for want of a descriptor (:data:`CAPACITY_ERRNOS`) goes to
an :class:`Exhaustion` per listener -- a WARNING without a traceback that says what to
do, then one line per :data:`~migratory.server.exhaustion.LOG_EVERY` seconds with a
count -- instead of trio's ERROR with a traceback every 0.1 s. Used for the cluster
link port (cluster/peers.py, cluster/standard.py), the Workers sequencer
(cluster/sequencer.py) and the monitoring listener (monitor_listener.py); the client
listeners have their own loop (app.py), which takes its connections from
:func:`accepted` (the same rule: said once, counted, backed off).
"""

from __future__ import annotations

import contextlib
import errno
import logging
import os
import socket
import struct
from collections.abc import Awaitable, Callable, Iterator, Sequence
from typing import Any, NoReturn

import trio

from migratory.server.exhaustion import CAPACITY_ERRNOS, RETRY_SECONDS, Exhaustion

log = logging.getLogger("migratory.accept")

Handler = Callable[[trio.SocketStream], Awaitable[object]]
Admit = Callable[[str], bool]
"""Asked with the peer's address for each accepted connection before anything is made
of it: False resets it (the cluster link port's rate per address,
cluster/link_accept.py)."""

RESET = struct.pack("ii", 1, 0)
"""SO_LINGER on, 0 s: ``close`` resets the connection (no FIN, no TIME_WAIT kept here)."""


def reset(sock: socket.socket | trio.socket.SocketType) -> None:
    """Close ``sock`` with a reset: nothing more to say, nothing to keep."""
    with contextlib.suppress(OSError):
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, RESET)
    sock.close()


GONE_BEFORE_ACCEPT = frozenset({errno.ECONNABORTED, errno.EPROTO})
"""``accept`` errors that concern only the connection it would have returned (reset
before it was accepted): take the next one."""


def accepted(
    listener: socket.socket, exhaustion: Exhaustion, *, most: int = 64
) -> Iterator[tuple[socket.socket, Any]]:
    """Up to ``most`` connections waiting on the non-blocking ``listener`` (stops when
    none is left). An ``accept`` that fails otherwise stops it too, counted and said by
    ``exhaustion`` (EMFILE and friends; anything else as well, rather than end the
    listener): the caller then waits ``exhaustion.retry`` while ``exhaustion.exhausted``."""
    for _ in range(most):
        try:
            connection = listener.accept()
        except BlockingIOError:
            return
        except OSError as exc:
            if exc.errno in GONE_BEFORE_ACCEPT:
                continue
            exhaustion.failed(exc)
            return
        exhaustion.succeeded()
        yield connection


def listener_name(name: str, listener: trio.SocketListener) -> str:
    """``cluster link port 127.0.0.1:9001``."""
    address = listener.socket.getsockname()
    return f"{name} {address[0]}:{address[1]}"


async def _run_handler(stream: trio.SocketStream, handler: Handler) -> None:
    try:
        await handler(stream)
    finally:
        await trio.aclose_forcefully(stream)


async def _serve_one(
    listener: trio.SocketListener,
    handler_nursery: trio.Nursery,
    handler: Handler,
    exhaustion: Exhaustion,
    admit: Admit | None,
) -> NoReturn:
    if admit is not None:
        await _serve_admitted(listener, handler_nursery, handler, exhaustion, admit)
    async with listener:
        while True:
            try:
                stream = await listener.accept()
            except OSError as exc:
                if exc.errno not in CAPACITY_ERRNOS:
                    raise
                exhaustion.failed(exc)
                await trio.sleep(exhaustion.retry)
            else:
                exhaustion.succeeded()
                handler_nursery.start_soon(_run_handler, stream, handler)


async def _serve_admitted(
    listener: trio.SocketListener,
    handler_nursery: trio.Nursery,
    handler: Handler,
    exhaustion: Exhaustion,
    admit: Admit,
) -> NoReturn:
    """:func:`_serve_one` with ``admit`` asked first, the connections taken as the client
    listeners take theirs (:func:`accepted`: up to 64 per wake-up, no trio object for
    one that is refused): a flood reset here costs ~1/3 of one taken through
    ``listener.accept()`` (a scheduler pass and a ``SocketStream`` each)."""
    raw = socket.socket(fileno=os.dup(listener.socket.fileno()))  # the same listening socket
    raw.setblocking(False)
    try:
        async with listener:
            while True:
                await trio.lowlevel.wait_readable(listener.socket)
                if exhaustion.exhausted:
                    await trio.sleep(exhaustion.retry)
                for sock, address in accepted(raw, exhaustion):
                    if not admit(str(address[0])):
                        reset(sock)
                        continue
                    stream = trio.SocketStream(trio.socket.from_stdlib_socket(sock))
                    handler_nursery.start_soon(_run_handler, stream, handler)
    finally:
        raw.close()


async def serve_listeners(
    handler: Handler,
    listeners: Sequence[trio.SocketListener],
    *,
    name: str,
    retry: float = RETRY_SECONDS,
    admit: Admit | None = None,
    task_status: trio.TaskStatus[Sequence[trio.SocketListener]] = trio.TASK_STATUS_IGNORED,
) -> NoReturn:
    """Serve ``listeners`` (closed when this ends) as ``trio.serve_listeners`` does;
    ``name`` begins their log lines (``"monitoring listener"``); ``admit``: see
    :data:`Admit`."""
    async with trio.open_nursery() as nursery:
        for listener in listeners:
            exhaustion = Exhaustion(log, listener_name(name, listener), retry=retry)
            nursery.start_soon(_serve_one, listener, nursery, handler, exhaustion, admit)
        task_status.started(listeners)
    raise AssertionError("_serve_one never returns")  # pragma: no cover


async def serve_tcp(
    handler: Handler,
    port: int,
    *,
    host: str,
    name: str,
    admit: Admit | None = None,
    task_status: trio.TaskStatus[Sequence[trio.SocketListener]] = trio.TASK_STATUS_IGNORED,
) -> NoReturn:
    """``trio.serve_tcp(handler, port, host=host)`` through :func:`serve_listeners`."""
    listeners = await trio.open_tcp_listeners(port, host=host)
    await serve_listeners(handler, listeners, name=name, admit=admit, task_status=task_status)
