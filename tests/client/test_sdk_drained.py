"""A server that drains (SIGTERM) closes with 4502 DRAINED after every status it owes:
the SDK then reports a publish still waiting as definitely not published, never as
unknown, and reconnects."""

from __future__ import annotations

import contextlib
import signal
import socket
from typing import Any

import pytest
import trio
import trio.testing
from sdk_fake_server import FAST, FakeServer, trio_test
from trio_websocket import ConnectionClosed, WebSocketConnection, wrap_client_stream

from migratory.model.message import Message
from migratory.model.position import Position
from migratory.protocol import close_codes, ops
from migratory.protocol import websocket as ws
from migratory.protocol.http import handshake_response
from migratory.protocol.http_server import RequestParser
from migratory.protocol.ops import Status
from migratory_client import (
    Keepalive,
    PublishOutcomeUnknown,
    PublishResult,
    ReconnectPolicy,
    connect,
)
from migratory_client.notifications import NotificationQueue
from migratory_client.resume import SubjectTracker
from migratory_client.routing import Outlet, PendingPublish, Router
from migratory_client.session import SUBPROTOCOL, NotSent, Session, SessionEnd


def test_publishes_waiting_at_a_drained_close_fail_definitely() -> None:
    router = Router(NotificationQueue(16))
    drained, lost = PendingPublish("/a/b", "c1"), PendingPublish("/a/b", "c2")
    router.pending["c1"] = drained
    router.session_lost("closed with 4502 DRAINED", untaken_failed=True)
    assert drained.result is not None and drained.result.status is Status.PUBLISH_FAILED
    assert drained.result.reason == "not published: closed with 4502 DRAINED"
    router.pending["c2"] = lost
    router.session_lost("connection lost")
    assert lost.result is None and lost.lost == "connection lost"
    assert close_codes.should_reconnect(close_codes.DRAINED.code)


def test_sigterm_drains_a_publishing_client_without_unknown_outcomes(start_server: Any) -> None:
    server = start_server(DrainTime="60")  # ends early, once every publish settled
    outcomes: dict[str, int] = {"ok": 0, "failed": 0, "unknown": 0}
    policy = ReconnectPolicy(initial_delay=0.05, max_delay=0.2, connect_timeout=1.0,
                             max_attempts=3)

    async def publisher(client: Any) -> None:
        for i in range(100_000):
            try:
                result = await client.publish("/drain/single", f"m{i}".encode(), timeout=5)
            except PublishOutcomeUnknown:
                outcomes["unknown"] += 1
                return
            except Exception:  # the server is gone: the client ends
                return
            outcomes["ok" if result.ok else "failed"] += 1
            if not result.ok:
                return

    async def main() -> None:
        async with connect([server.url], reconnect=policy) as client:
            await client.wait_connected()
            async with trio.open_nursery() as nursery:
                for _ in range(4):
                    nursery.start_soon(publisher, client)
                while outcomes["ok"] <= 10:  # publishing for real when SIGTERM comes
                    await trio.sleep(0.05)
                server.proc.send_signal(signal.SIGTERM)
                await trio.to_thread.run_sync(server.proc.wait, 90)  # a hang guard
                nursery.cancel_scope.cancel()

    trio.run(main)
    assert server.proc.returncode == 0, server.log()
    assert outcomes["ok"] > 10 and outcomes["unknown"] == 0, outcomes
    log = server.log()
    assert "drained in" in log and "left as told" in log, log  # (each 4502 at DEBUG)
    # the drain ended because every client left and every publish settled, not by time
    (drained,) = [line for line in log.splitlines() if "drained in" in line]
    assert "0 still connected" in drained and "DrainTime reached" not in drained, drained


# --- the statuses before a 4502 must all be read before "not published" is believed ---
#
# Chaos run m30 (1547 s): a draining non-seed answered 33 publishes of p1 and closed
# with 4502, through a proxy that then closed the TCP connection. The publisher's
# process was busy: trio-websocket had read the statuses and the close frame but handed
# them over one by one. A publish written meanwhile hit the broken connection;
# trio-websocket then closes its message channel (frames not handed over are dropped)
# and, when its reader reaches the close frame, records 4502 as the close reason. The
# session ended "closed with 4502" and reported 25 publishes the server had
# acknowledged (subscribers got them) as not published.

CLOSURES = ("c1", "c2", "c3", "c4")


def status_frame(closure: str, seq: int) -> bytes:
    status = ops.PublishStatus(Status.PUBLISH_OK, closure, "/a/b", Position(7, seq))
    return ws.encode_binary(ops.encode_server_op(status))


async def answer_upgrade(stream: trio.abc.Stream) -> None:
    parser = RequestParser()
    request = None
    while request is None:
        request = parser.receive_data(await stream.receive_some())
    await stream.send_all(handshake_response(request))


DRAINED_CLOSE = ws.encode_close(close_codes.DRAINED.code, "member is draining")


class Writes(trio.abc.SendStream):
    """The client's sending side; once ``broken`` (the proxy closed the connection), a
    write fails at once, without a checkpoint, as a socket's failing send() does."""

    def __init__(self, inner: trio.abc.SendStream) -> None:
        self.inner = inner
        self.broken = False
        self.held: trio.Event | None = None  # set: writes wait for it (a slow write)
        self.slow = 0.0  # each write takes this long: a server that reads, slowly

    async def send_all(self, data: bytes | bytearray | memoryview) -> None:
        if self.broken:
            raise trio.BrokenResourceError("connection reset by peer")
        if self.held is not None:
            await self.held.wait()
        await trio.sleep(self.slow)
        await self.inner.send_all(data)

    async def wait_send_all_might_not_block(self) -> None:
        await self.inner.wait_send_all_might_not_block()

    async def aclose(self) -> None:
        await self.inner.aclose()


async def connection_that_received(
    nursery: trio.Nursery, data: bytes
) -> tuple[WebSocketConnection, Writes]:
    """A client connection over memory streams once trio-websocket has read ``data`` from
    the server (one write) and handed over what its one-message channel takes."""
    client_stream, server_stream = trio.testing.memory_stream_pair()
    writes = Writes(client_stream.send_stream)
    stream = trio.StapledStream(writes, client_stream.receive_stream)
    nursery.start_soon(answer_upgrade, server_stream)
    connection = await wrap_client_stream(
        nursery, stream, "drained", "/", subprotocols=[SUBPROTOCOL]  # type: ignore[arg-type]
    )
    await server_stream.send_all(data)
    await trio.testing.wait_all_tasks_blocked()
    return connection, writes


async def drained_session(nursery: trio.Nursery, router: Router) -> tuple[Session, Writes]:
    """A session whose server answered every publish of CLOSURES and closed with 4502,
    in one write that the client has read but not handed over."""
    statuses = b"".join(status_frame(c, seq) for seq, c in enumerate(CLOSURES, 1))
    connection, writes = await connection_that_received(nursery, statuses + DRAINED_CLOSE)
    return Session(connection, "ws://drained", 1, router, Keepalive()), writes


def waiting(router: Router) -> list[PendingPublish]:
    pending = [PendingPublish("/a/b", c) for c in CLOSURES]
    router.pending.update({p.closure: p for p in pending})
    return pending


def not_published(pending: list[PendingPublish]) -> list[str]:
    return [
        p.closure
        for p in pending
        if p.result is not None and p.result.status is Status.PUBLISH_FAILED
    ]


@trio_test
async def test_a_write_that_breaks_before_the_statuses_are_read_makes_them_unknown() -> None:
    router = Router(NotificationQueue(16))
    pending = waiting(router)
    async with trio.open_nursery() as nursery:
        session, writes = await drained_session(nursery, router)
        writes.broken = True  # the proxy closed the connection
        late = ops.Publish(Message("/a/b", b"late", closure="c9"))
        with pytest.raises(ConnectionClosed):
            await session.send(late)
        end = await session.serve(())
        router.session_lost(end.describe(), untaken_failed=end.untaken_not_published)
        nursery.cancel_scope.cancel()
    assert end.code == close_codes.DRAINED.code  # what the SDK saw in the chaos run
    assert not_published(pending) == []
    assert all(p.lost is not None or (p.result and p.result.ok) for p in pending)


@trio_test
async def test_publishes_the_drained_server_did_not_answer_are_not_published() -> None:
    router = Router(NotificationQueue(16))
    pending = waiting(router)
    untaken = PendingPublish("/a/b", "c5")  # written after the close: never read
    router.pending["c5"] = untaken
    async with trio.open_nursery() as nursery:
        session, _ = await drained_session(nursery, router)
        end = await session.serve(())
        router.session_lost(end.describe(), untaken_failed=end.untaken_not_published)
        nursery.cancel_scope.cancel()
    assert end.read_all and end.untaken_not_published
    assert all(p.result is not None and p.result.ok for p in pending)
    assert not_published([untaken]) == ["c5"]


async def closed_with_one_status_unread(
    nursery: trio.Nursery, router: Router, keepalive: Keepalive
) -> Session:
    """trio-websocket has read PUBLISH_OK c1 and the 4502 close: c1 waits in its channel,
    the connection reports itself closed (a send raises ConnectionClosed)."""
    connection, _ = await connection_that_received(nursery, status_frame("c1", 1) + DRAINED_CLOSE)
    assert connection.closed is not None
    return Session(connection, "ws://drained", 1, router, keepalive)


@trio_test
async def test_a_send_by_the_reader_on_a_closed_connection_does_not_skip_unread_statuses() -> None:
    router = Router(NotificationQueue(16))
    router.add([SubjectTracker("/x/y")], Outlet(trio.open_memory_channel[Message](8)[0]))
    first = PendingPublish("/a/b", "c1")
    router.pending["c1"] = first
    async with trio.open_nursery() as nursery:
        session = await closed_with_one_status_unread(nursery, router, Keepalive())
        end = await session.serve(router.requests_for(1))  # its subscribe cannot be sent
        nursery.cancel_scope.cancel()
    assert end.code == close_codes.DRAINED.code and end.read_all
    assert first.result is not None and first.result.ok


@trio_test
async def test_a_keepalive_ping_on_a_closed_connection_lets_the_reader_finish() -> None:
    router = Router(NotificationQueue(16))
    first = PendingPublish("/a/b", "c1")
    router.pending["c1"] = first
    keepalive = Keepalive(interval=0.01, timeout=2.0)
    async with trio.open_nursery() as nursery:
        session = await closed_with_one_status_unread(nursery, router, keepalive)
        dispatch = session._dispatch

        async def busy_reader(payload: str | bytes) -> None:  # a busy process
            await trio.sleep(0.1)  # the keepalive's ping finds the connection closed
            await dispatch(payload)

        session._dispatch = busy_reader  # type: ignore[method-assign,unused-ignore]
        with trio.fail_after(1):  # the reader ends the session, not the keepalive timeout
            end = await session.serve(())
        nursery.cancel_scope.cancel()
    assert end.code == close_codes.DRAINED.code and end.read_all
    assert first.result is not None and first.result.ok


def test_a_write_that_breaks_while_the_reader_reads_makes_the_statuses_unknown() -> None:
    # As in the chaos run: the publish is written while the session reads. Its write
    # closes trio-websocket's channel before the write returns, so the reader can end
    # the session first. trio runs ready tasks in either order: try it many times.
    async def once() -> tuple[SessionEnd, list[str]]:
        router = Router(NotificationQueue(16))
        pending = waiting(router)
        async with trio.open_nursery() as nursery:
            session, writes = await drained_session(nursery, router)
            writes.broken = True

            async def publish_late() -> None:
                with contextlib.suppress(ConnectionClosed):
                    await session.send(ops.Publish(Message("/a/b", b"late", closure="c9")))

            nursery.start_soon(publish_late)
            end = await session.serve(())
            router.session_lost(end.describe(), untaken_failed=end.untaken_not_published)
            nursery.cancel_scope.cancel()
        return end, not_published(pending)

    ends = []
    for _ in range(40):
        end, failed = trio.run(once)
        assert failed == [], end
        ends.append(end.code)
    assert close_codes.DRAINED.code in ends  # the chaos run's case was among them


@trio_test
async def test_a_write_under_way_that_succeeds_keeps_the_drained_close_definite() -> None:
    # A slow write while the server closes: trio-websocket writes its close reply after
    # it (one lock), so the write is done before the reader sees the end -- nothing was
    # dropped, and publishes the server did not answer are still definitely not published.
    router = Router(NotificationQueue(16))
    pending = waiting(router)
    untaken = PendingPublish("/a/b", "c5")
    router.pending["c5"] = untaken
    async with trio.open_nursery() as nursery:
        session, writes = await drained_session(nursery, router)
        writes.held = trio.Event()

        async def publish_late() -> None:
            await session.send(ops.Publish(Message("/a/b", b"late", closure="c5")))

        async def write_slowly() -> None:  # until the reader has seen the close
            await trio.testing.wait_all_tasks_blocked()
            assert writes.held is not None
            writes.held.set()

        nursery.start_soon(publish_late)
        nursery.start_soon(write_slowly)
        end = await session.serve(())
        router.session_lost(end.describe(), untaken_failed=end.untaken_not_published)
        nursery.cancel_scope.cancel()
    assert end.read_all and end.untaken_not_published
    assert all(p.result is not None and p.result.ok for p in pending)
    assert not_published([untaken]) == ["c5"]


# --- a publish the session ended before writing is not sent, and goes out again --------
#
# Chaos rolling restart (seed 32, 2026-11-28): SDK publishers, open loop, 1,992
# publishes "outcome unknown: connection lost while sending" while one member at a time
# drained or a stalled connection was given up. Most had never been written: they waited
# behind another write for trio-websocket's lock, their frame already made, and were
# then written after the server's close (and discarded) or failed on the broken stream.


async def open_connection(
    nursery: trio.Nursery,
) -> tuple[WebSocketConnection, Writes, trio.StapledStream[Any, Any]]:
    client_stream, server_stream = trio.testing.memory_stream_pair()
    writes = Writes(client_stream.send_stream)
    stream = trio.StapledStream(writes, client_stream.receive_stream)
    nursery.start_soon(answer_upgrade, server_stream)
    connection = await wrap_client_stream(
        nursery, stream, "queued", "/", subprotocols=[SUBPROTOCOL]  # type: ignore[arg-type]
    )
    return connection, writes, server_stream


def publish_op(closure: str) -> ops.Publish:
    return ops.Publish(Message("/a/b", b"x", closure=closure))


async def send_all_three(session: Session, outcomes: dict[str, str]) -> None:
    """c1, c2, c3 sent at once (c1 first: its write holds the lock); their outcomes."""

    async def send(closure: str) -> None:
        try:
            await session.send(publish_op(closure))
            outcomes[closure] = "written"
        except NotSent:
            outcomes[closure] = "not sent"
        except ConnectionClosed:
            outcomes[closure] = "lost"

    async with trio.open_nursery() as nursery:
        for closure in ("c1", "c2", "c3"):
            nursery.start_soon(send, closure)
            await trio.testing.wait_all_tasks_blocked()


@trio_test
async def test_sends_queued_behind_a_write_when_the_server_closes_are_not_sent() -> None:
    router = Router(NotificationQueue(16))
    outcomes: dict[str, str] = {}
    async with trio.open_nursery() as nursery:
        connection, writes, server_stream = await open_connection(nursery)
        session = Session(connection, "ws://queued", 1, router, Keepalive())
        writes.held = trio.Event()  # c1's write waits: c2 and c3 queue behind it
        nursery.start_soon(send_all_three, session, outcomes)
        await trio.testing.wait_all_tasks_blocked()
        await server_stream.send_all(DRAINED_CLOSE)  # the drain's close arrives
        await trio.testing.wait_all_tasks_blocked()
        assert connection.closed is not None
        writes.held.set()
        end = await session.serve(())
        nursery.cancel_scope.cancel()
    # before: c2 was written after the close (the server never reads it: unknown), c3
    # failed on the stream trio-websocket closed after its close reply ("lost": unknown)
    assert outcomes == {"c1": "written", "c2": "not sent", "c3": "not sent"}
    assert end.code == close_codes.DRAINED.code and end.untaken_not_published


def test_sends_queued_behind_a_stalled_write_are_not_sent() -> None:
    async def main() -> None:
        router = Router(NotificationQueue(16))
        outcomes: dict[str, str] = {}
        async with trio.open_nursery() as nursery:
            connection, writes, _ = await open_connection(nursery)
            session = Session(connection, "ws://stalled", 1, router, Keepalive(timeout=2.0))
            writes.held = trio.Event()  # never set: the server reads nothing
            await send_all_three(session, outcomes)
            nursery.cancel_scope.cancel()
        # before: all three "lost" (c2 and c3 failed on the stream given up, unwritten)
        assert outcomes == {"c1": "lost", "c2": "not sent", "c3": "not sent"}

    trio.run(main, clock=trio.testing.MockClock(autojump_threshold=0))


def test_sends_queued_behind_writes_that_finish_keep_the_session() -> None:
    """The server reads every write, each within the keepalive timeout (0.2 s of 0.3 s),
    but three queued take 0.6 s: the session is good, all three are written. Before: the
    timeout counted the wait for the send lock too; c2 (0.2 s waiting) was cut mid-write
    ("lost"), c3 not sent, and a session whose server reads was given up as "could not
    send" (CI: test_sdk_hostile_server's, now
    test_sdk_hostile_answers's, second session, load 6-18, BrokenPipeError)."""

    async def main() -> None:
        router = Router(NotificationQueue(16))
        outcomes: dict[str, str] = {}
        async with trio.open_nursery() as nursery:
            connection, writes, _ = await open_connection(nursery)
            session = Session(connection, "ws://slow", 1, router, Keepalive(timeout=0.3))
            writes.slow = 0.2
            await send_all_three(session, outcomes)
            assert outcomes == {"c1": "written", "c2": "written", "c3": "written"}
            assert session.is_open
            nursery.cancel_scope.cancel()

    trio.run(main, clock=trio.testing.MockClock(autojump_threshold=0))


@trio_test
async def test_a_publish_not_sent_goes_out_on_the_next_session() -> None:
    """The first server reads nothing (a stalled member): the 12 MiB written first fills
    the connection, the small publish behind it waits; the session is given up after the
    keepalive timeout, and the small publish is published on the next session, once.
    Before: PublishOutcomeUnknown ("connection lost while sending")."""
    big = b"x" * (4 * 2**20)
    results: dict[str, Any] = {}
    async with trio.open_nursery() as nursery:
        server = await FakeServer(max_message_size=2**26).start(nursery)
        keepalive = Keepalive(interval=30.0, timeout=1.0)
        async with connect([server.url], reconnect=FAST, keepalive=keepalive) as client:
            stalled = await server.next_connection()
            await stalled.accept_session()
            # a small receive buffer, not grown by the kernel: the 12 MiB cannot all fit
            sock = stalled.ws._stream.socket  # type: ignore[attr-defined]  # test-only
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 64 * 1024)

            async def publish(name: str, content: bytes) -> None:
                try:
                    results[name] = await client.publish("/a/b", content, timeout=4)
                except PublishOutcomeUnknown as exc:
                    results[name] = exc

            for i in range(3):
                nursery.start_soon(publish, f"big{i}", big)
                await trio.testing.wait_all_tasks_blocked()
            nursery.start_soon(publish, "small", b"small")
            second = await server.next_connection()
            await second.accept_session()
            publish_op = None
            with trio.move_on_after(2):
                publish_op = await second.expect(ops.Publish)
            assert publish_op is not None, results.get("small")
            assert publish_op.message.content == b"small"
            await second.send(ops.PublishStatus(Status.PUBLISH_OK, publish_op.message.closure,
                                                "/a/b", Position(3, 1)))
            with trio.fail_after(2):
                while "small" not in results:
                    await trio.sleep(0.01)
            stalled.released.set()
        nursery.cancel_scope.cancel()
    assert isinstance(results["small"], PublishResult) and results["small"].ok
