"""Adaptive batching (``BatchIdleWrite``): a client with nothing written for a
BatchTime gets its message at once; one written to since the batch tick before last
waits for the next tick, so a busy client still gets about one write per BatchTime."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

import trio
from rawclient import RawClient

from migratory.config import load_config
from migratory.model.message import Message
from migratory.protocol import ops
from migratory.protocol import websocket as ws
from migratory.protocol.http import check_handshake_response, handshake_request, new_websocket_key
from migratory.server.app import Server

SUBJECT = "/batching/idle"
T = TypeVar("T")


class Link:
    """Stands in for a Connection: the batch tick flushes it."""

    batch_slowly = False  # a plain listener's client

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


HANG_GUARD = 30.0  # s: only against a hang, never the claim


def _with_ticks_held(
    overrides: dict[str, str], steps: Callable[[int, Callable[[], None]], T]
) -> tuple[T, int]:
    """Runs ``steps(port, release)`` (in a thread) against an in-process server whose
    batch ticks write nothing until ``release()``; returns its result and how many ticks
    were held. With the ticks held, what a client gets came by an idle write or not at
    all -- however slow the box, no tick can deliver it meanwhile."""
    server = Server(load_config(
        overrides={"Listen": "127.0.0.1:0", "BatchTime": "200", **overrides}, environ={},
    ))
    batch_tick, held = server.batch_tick, []

    def release() -> None:
        server.batch_tick = batch_tick  # type: ignore[method-assign]

    server.batch_tick = lambda: held.append(1)  # type: ignore[method-assign]
    results: list[T] = []

    async def main() -> None:
        async with trio.open_nursery() as nursery:
            ((_host, port), *_) = await nursery.start(server.serve)
            results.append(await trio.to_thread.run_sync(steps, port, release))
            nursery.cancel_scope.cancel()

    trio.run(main)
    return results[0], len(held)


def _publish_to_a_quiet_subscriber(port: int) -> RawClient:
    subscriber = RawClient(port, timeout=HANG_GUARD)
    subscriber.connect("subscriber")
    subscriber.subscribe(SUBJECT)
    while not isinstance(subscriber.recv_op(), ops.SubjectStatus):
        pass
    publisher = RawClient(port)
    publisher.connect("publisher")
    publisher.send_op(ops.Publish(Message(SUBJECT, b"first")))
    return subscriber


def _delivered(subscriber: RawClient, timeout: float) -> list[bytes]:
    try:
        op = subscriber.recv_op(timeout)
    except TimeoutError:
        return []
    assert isinstance(op, ops.Deliver), op
    return [m.content for m in op.messages]


def test_a_quiet_subscriber_does_not_wait_for_batch_time() -> None:
    def steps(port: int, release: Callable[[], None]) -> list[bytes]:
        return _delivered(_publish_to_a_quiet_subscriber(port), HANG_GUARD)

    delivered, _held = _with_ticks_held({}, steps)
    assert delivered == [b"first"]  # by an idle write: every tick was held


def test_without_idle_write_a_message_waits_for_the_tick() -> None:
    """The control: without idle writes nothing comes while the ticks are held (so the
    test above does tell the two apart), and the next tick delivers it."""

    def steps(port: int, release: Callable[[], None]) -> tuple[list[bytes], list[bytes]]:
        subscriber = _publish_to_a_quiet_subscriber(port)
        while_held = _delivered(subscriber, 1.0)  # 5 ticks of 200 ms, all held
        release()
        return while_held, _delivered(subscriber, HANG_GUARD)

    (while_held, after), held = _with_ticks_held({"BatchIdleWrite": "false"}, steps)
    assert while_held == [] and held > 0
    assert after == [b"first"]


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


# --- idle writes from the task that processed the input (no wake-up of another task) ---


class Peer:
    """The client end of a socketpair whose server end is a :class:`Connection` (not
    started): a WebSocket handshake and ``connect`` (and a ``subscribe``) already sent."""

    def __init__(self, server: Server, name: str, subject: str | None = None) -> None:
        import socket

        from migratory.listeners import OPEN_LISTENER
        from migratory.server.connection import Connection

        ours, self.sock = socket.socketpair()
        ours.setblocking(False)
        self.sock.setblocking(False)
        self.connection = Connection(server, ours, f"127.0.0.1:{len(name)}", OPEN_LISTENER)
        server.connections.add(self.connection)
        self.decoder = ws.FrameDecoder(client_frames=False, max_message_size=1 << 24)
        self._key = new_websocket_key()
        self._buf = b""
        hello = handshake_request("127.0.0.1", "/", self._key) + _masked(ops.Connect(name))
        if subject is not None:
            hello += _masked(ops.Subscribe((ops.SubscriptionRequest(subject),)))
        self.sock.sendall(hello)

    def ops(self) -> list[ops.ServerOp]:
        """Every operation the server has written so far (without waiting)."""
        while True:
            try:
                chunk = self.sock.recv(1 << 20)
            except BlockingIOError:
                break
            if self._key:
                self._buf += chunk
                used = check_handshake_response(self._buf, self._key)
                if used is None:
                    continue
                chunk, self._key, self._buf = self._buf[used:], "", b""
            self.decoder.receive_data(chunk)
        out = []
        while (event := self.decoder.next_event()) is not None:
            assert isinstance(event, ws.BinaryMessage), event
            out.append(ops.decode_server_op(event.data))
        return out

    def publish(self, *contents: bytes) -> None:
        """One ``send`` of acknowledged publishes to SUBJECT."""
        self.sock.sendall(b"".join(
            _masked(ops.Publish(Message(SUBJECT, content, closure=content.decode())))
            for content in contents
        ))

    def close(self) -> None:
        self.sock.close()


def _masked(op: ops.ClientOp) -> bytes:
    return ws.encode_masked_binary(ops.encode_client_op(op), b"mask")


async def _wait_for(peer: Peer, kind: type, count: int = 1) -> list[ops.ServerOp]:
    """The operations ``peer`` got until ``count`` of ``kind`` (2 s at most)."""
    got: list[ops.ServerOp] = []
    with trio.fail_after(2):
        while sum(isinstance(op, kind) for op in got) < count:
            await trio.sleep(0.001)
            got += peer.ops()
    return got


def _run_peers(test: Any, **settings: str) -> None:
    """Run ``test(server, publisher, subscriber)`` with both peers' readers going but
    neither the idle-write task nor (unless the test starts it) the batch tick."""
    server = Server(load_config(overrides={"Listen": "127.0.0.1:0", **settings}, environ={}))
    publisher, subscriber = Peer(server, "publisher"), Peer(server, "subscriber", SUBJECT)

    async def main() -> None:
        async with trio.open_nursery() as nursery:
            server._nursery = nursery
            nursery.start_soon(publisher.connection.run)
            nursery.start_soon(subscriber.connection.run)
            await _wait_for(publisher, ops.Connected)
            await _wait_for(subscriber, ops.SubjectStatus)
            server.written.clear()  # the set-up's replies made nobody busy
            await test(server, publisher, subscriber)
            nursery.cancel_scope.cancel()

    try:
        trio.run(main)
    finally:
        publisher.close()
        subscriber.close()


def _contents(got: list[ops.ServerOp]) -> list[bytes]:
    return [m.content for op in got if isinstance(op, ops.Deliver) for m in op.messages]


def test_an_idle_subscriber_is_written_by_the_publishers_task_without_a_wake_up() -> None:
    """The publisher's acknowledgement comes back after its input was processed; by then
    the idle subscriber's message is in its socket too, though no idle-write task runs,
    and none was woken."""

    async def test(server: Server, publisher: Peer, subscriber: Peer) -> None:
        writes = server.ctx.stats.writes
        publisher.publish(b"one")
        await _wait_for(publisher, ops.PublishStatus)
        assert _contents(subscriber.ops()) == [b"one"]
        assert not server._urgent_wake.is_set() and not server.urgent
        assert server.ctx.stats.writes - writes == 2  # the acknowledgement, the message

    _run_peers(test, BatchTime="4000")


def test_what_one_input_delivers_goes_out_in_one_write_and_a_busy_subscriber_waits() -> None:
    """Five publishes read at once: one write of five frames to the subscriber; the
    subscriber is busy now, so the next message waits for the batch tick."""

    async def test(server: Server, publisher: Peer, subscriber: Peer) -> None:
        batches, writes = server.ctx.batch_sizes.sizes[5], server.ctx.stats.writes
        publisher.publish(b"1", b"2", b"3", b"4", b"5")
        await _wait_for(publisher, ops.PublishStatus, 5)
        assert _contents(subscriber.ops()) == [b"1", b"2", b"3", b"4", b"5"]
        # two writes of five frames: the acknowledgements, the messages
        assert server.ctx.stats.writes - writes == 2
        assert server.ctx.batch_sizes.sizes[5] == batches + 2
        publisher.publish(b"6")
        await _wait_for(publisher, ops.PublishStatus)
        assert not subscriber.ops() and server.dirty == {subscriber.connection}
        server.batch_tick()
        assert _contents(subscriber.ops()) == [b"6"]

    _run_peers(test, BatchTime="4000")


def test_order_is_kept_when_the_socket_is_full_and_a_drain_task_takes_over() -> None:
    """A subscriber that does not read for a while: its socket fills, the rest waits in
    its outbox for a drain task (and the ticks); it gets every message in order."""
    count = 300

    async def test(server: Server, publisher: Peer, subscriber: Peer) -> None:
        import socket

        server.nursery.start_soon(server._batch_loop)
        subscriber.connection.sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 4096)
        sent = [b"%04d" % i + b"x" * 2000 for i in range(count)]
        for i in range(0, count, 10):
            publisher.publish(*sent[i : i + 10])
            await _wait_for(publisher, ops.PublishStatus, 10)
        assert subscriber.connection.writing  # the socket filled: a drain task waits
        got: list[ops.ServerOp] = []
        with trio.fail_after(5):
            while len(_contents(got)) < count:
                await trio.sleep(0.001)
                got += subscriber.ops()
        assert _contents(got) == sent

    _run_peers(test, BatchTime="20")


def test_processing_that_fails_leaves_its_idle_writes_to_the_idle_write_task() -> None:
    """An input whose processing raised after it delivered: the idle-write task is woken
    for what it delivered (the reader task ends without writing it)."""

    async def test(server: Server, publisher: Peer, subscriber: Peer) -> None:
        from migratory.server.session import Session

        class Failing(Session):
            __slots__ = ()

            def receive_data(self, *_args: object, **_kwargs: object) -> bool:
                subscriber.connection.session.deliver(b"frame")
                raise RuntimeError("planted")

        publisher.connection.session.__class__ = Failing
        publisher.publish(b"one")
        with trio.fail_after(2):
            while not server._urgent_wake.is_set():
                await trio.sleep(0.001)
        assert server.urgent == {subscriber.connection} and server.processing is None

    _run_peers(test, BatchTime="4000")
