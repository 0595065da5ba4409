"""Adaptive batching (``BatchIdleWrite``): a client with nothing written for a
BatchTime gets its message at once; one written to since the batch tick before last
waits for the next tick, so a busy client still gets about one write per BatchTime."""

from __future__ import annotations

import time
from typing import Any

from migratory.config import load_config
from migratory.model.message import Message
from migratory.protocol import ops
from migratory.server.app import Server
from tests.server.rawclient import RawClient

SUBJECT = "/batching/idle"


class Link:
    """Stands in for a Connection: the batch tick flushes it."""

    def __init__(self) -> None:
        self.flushes = 0

    def flush(self) -> None:
        self.flushes += 1


def test_an_idle_connection_is_written_at_once_and_a_busy_one_waits_for_the_tick() -> None:
    server = Server(load_config(overrides={"Listen": "127.0.0.1:0"}, environ={}))
    quiet, busy = Link(), Link()
    server.mark_dirty(busy)  # type: ignore[arg-type]
    assert server.urgent == {busy}  # idle: written at the end of this pass
    server.urgent.clear()
    server.written.add(busy)  # type: ignore[arg-type]  # (as the idle-write loop does)
    server.mark_dirty(busy)  # type: ignore[arg-type]
    server.mark_dirty(quiet)  # type: ignore[arg-type]
    assert server.urgent == {quiet} and server.dirty == {busy}
    server.batch_tick()  # busy gets its batch; still busy until the tick after next
    assert busy.flushes == 1 and not server.dirty
    server.mark_dirty(busy)  # type: ignore[arg-type]
    assert server.dirty == {busy}
    server.batch_tick()  # written again by this tick
    server.batch_tick()
    server.mark_dirty(busy)  # type: ignore[arg-type]
    assert server.dirty == {busy}  # written in the interval before: still busy
    server.dirty.clear()
    server.batch_tick()  # a whole tick interval with nothing written: idle again
    server.mark_dirty(busy)  # type: ignore[arg-type]
    assert busy in server.urgent


def test_without_idle_write_everything_waits_for_the_tick() -> None:
    server = Server(load_config(
        overrides={"Listen": "127.0.0.1:0", "BatchIdleWrite": "false"}, environ={},
    ))
    quiet = Link()
    server.mark_dirty(quiet)  # type: ignore[arg-type]
    assert server.dirty == {quiet} and not server.urgent


def _updates_after_publishes(port: int) -> tuple[float, float]:
    """Seconds from publish to delivery for two publishes, the second sent as soon as
    the first arrived."""
    subscriber = RawClient(port, timeout=12)
    subscriber.connect("subscriber")
    subscriber.subscribe(SUBJECT)
    while not isinstance(subscriber.recv_op(), ops.SubjectStatus):
        pass
    publisher = RawClient(port)
    publisher.connect("publisher")
    waited = []
    for content in (b"first", b"second"):
        started = time.monotonic()
        publisher.send_op(ops.Publish(Message(SUBJECT, content)))
        while not isinstance(subscriber.recv_op(), ops.Deliver):
            pass
        waited.append(time.monotonic() - started)
    return waited[0], waited[1]


def test_a_quiet_subscriber_does_not_wait_for_batch_time(start_server: Any) -> None:
    server = start_server(BatchTime="4000")
    first, _second = _updates_after_publishes(server.port)
    assert first < 1.0  # the tick is 4 s apart


def test_without_idle_write_a_message_waits_for_the_tick(start_server: Any) -> None:
    """The control: the first update arrives with a tick, the second one a whole
    BatchTime later (so the test above does tell the two apart)."""
    server = start_server(BatchTime="4000", BatchIdleWrite="false")
    _first, second = _updates_after_publishes(server.port)
    assert second > 3.0


def test_a_connection_tells_the_server_once_per_batch() -> None:
    """Session.deliver marks its connection dirty for every frame: the connection tells
    the server the first time only, and again once a flush has written what waited."""
    import socket

    from migratory.listeners import client_listeners
    from migratory.server.connection import Connection

    server = Server(load_config(overrides={"Listen": "127.0.0.1:0"}, environ={}))
    told: list[object] = []
    server.mark_dirty = told.append  # type: ignore[method-assign]
    ours, theirs = socket.socketpair()
    ours.setblocking(False)
    try:
        connection = Connection(server, ours, "127.0.0.1:1", client_listeners(server.config)[0])
        for frame in (b"one", b"two", b"three"):
            connection.session.deliver(frame)
        assert told == [connection]
        connection.flush()
        assert theirs.recv(100) == b"onetwothree"
        connection.session.deliver(b"four")
        connection.session.deliver(b"five")
        assert told == [connection, connection]
        connection.flush()
        assert theirs.recv(100) == b"fourfive"
    finally:
        ours.close()
        theirs.close()
