"""Publishing through the trio client and the blocking Publisher, against a fake server."""

from __future__ import annotations

import socket

import pytest
import trio
import trio.testing
from sdk_fake_server import FAST, FakeConnection, FakeServer, start_servers, trio_test

from migratory.model.message import Qos
from migratory.model.position import Position
from migratory.protocol import ops
from migratory_client import (
    Client,
    InvalidSubjectError,
    Keepalive,
    NotConnectedError,
    Notification,
    NotificationStatus,
    Publisher,
    PublishOutcomeUnknown,
    PublishResult,
    Status,
    connect,
)


def ok(publish: ops.Publish, seq: int) -> ops.PublishStatus:
    message = publish.message
    return ops.PublishStatus(Status.PUBLISH_OK, message.closure, message.subject, Position(3, seq))


@trio_test
async def test_statuses_are_matched_by_closure() -> None:
    results: dict[str, PublishResult] = {}
    async with trio.open_nursery() as nursery:
        (server,) = await start_servers(nursery)
        async with connect([server.url], reconnect=FAST) as client:

            async def publish(subject: str) -> None:
                results[subject] = await client.publish(subject, "héllo", {"k": "v"}, retained=True)

            nursery.start_soon(publish, "/a/one")
            nursery.start_soon(publish, "/a/two")
            conn = await server.next_connection()
            await conn.accept_session()
            first = await conn.expect(ops.Publish)
            second = await conn.expect(ops.Publish)
            assert first.message.closure != second.message.closure
            assert first.message.content == "héllo".encode()
            assert first.message.retained and first.message.fields == {"k": "v"}
            await conn.send(ok(second, 8), ok(first, 9))
            await trio.sleep(0.05)
            assert results[second.message.subject].position == Position(3, 8)
            assert results[first.message.subject].position == Position(3, 9)
            assert results["/a/one"].ok
        nursery.cancel_scope.cancel()


@trio_test
async def test_denied_publish_is_a_result_not_an_exception() -> None:
    async with trio.open_nursery() as nursery:
        (server,) = await start_servers(nursery)
        async with connect([server.url], reconnect=FAST) as client:

            async def answer(conn: FakeConnection) -> None:
                publish = await conn.expect(ops.Publish)
                assert publish.message.qos is Qos.GUARANTEED
                await conn.send(
                    ops.PublishStatus(
                        Status.PUBLISH_DENIED, publish.message.closure, "/a/b", None, "no"
                    )
                )

            conn = await server.next_connection()
            await conn.accept_session()
            nursery.start_soon(answer, conn)
            result = await client.publish("/a/b", b"x", qos=Qos.GUARANTEED)
            assert (result.status, result.reason, result.ok) == (Status.PUBLISH_DENIED, "no", False)
        nursery.cancel_scope.cancel()


@trio_test
async def test_connection_lost_before_status_is_an_unknown_outcome() -> None:
    async with trio.open_nursery() as nursery:
        (server,) = await start_servers(nursery)
        async with connect([server.url], reconnect=FAST) as client:

            async def drop_after_publish() -> None:
                conn = await server.next_connection()
                await conn.accept_session()
                await conn.expect(ops.Publish)
                await conn.drop()

            nursery.start_soon(drop_after_publish)
            with pytest.raises(PublishOutcomeUnknown) as info:
                await client.publish("/a/b", b"x")
            assert info.value.subject == "/a/b"
            assert info.value.closure
            conn = await server.next_connection()  # reconnected, but nothing re-sent
            await conn.accept_session()
            with trio.move_on_after(0.1):
                await conn.receive()
                raise AssertionError("the publish was retried")
        nursery.cancel_scope.cancel()


@trio_test
async def test_no_status_within_timeout_is_an_unknown_outcome() -> None:
    async with trio.open_nursery() as nursery:
        (server,) = await start_servers(nursery)
        async with connect([server.url], reconnect=FAST) as client:
            conn = await server.next_connection()
            await conn.accept_session()
            with pytest.raises(PublishOutcomeUnknown, match="no status"):
                await client.publish("/a/b", b"x", timeout=0.1)
        nursery.cancel_scope.cancel()


@trio_test
async def test_invalid_subject_and_no_server() -> None:
    async with trio.open_nursery() as nursery:
        (server,) = await start_servers(nursery)
        url = server.url
        nursery.cancel_scope.cancel()
    async with connect([url], reconnect=FAST) as client:
        with pytest.raises(InvalidSubjectError):
            await client.publish("a/b", b"x")
        with pytest.raises(InvalidSubjectError):
            client.subscribe("/a/")
        with pytest.raises(NotConnectedError) as info:
            await client.publish("/a/b", b"x", timeout=0.1)
        assert info.value.timeout == 0.1
        with pytest.raises(NotConnectedError):  # was: waited for a session for ever
            await client.publish_nowait("/a/b", b"x", timeout=0.1)


@trio_test
async def test_publish_nowait_failures_arrive_as_notifications() -> None:
    async with trio.open_nursery() as nursery:
        (server,) = await start_servers(nursery)
        async with connect([server.url], reconnect=FAST) as client:
            conn = await server.next_connection()
            await conn.accept_session()
            await client.publish_nowait("/a/b", b"x" * 10)
            publish = await conn.expect(ops.Publish)
            assert publish.message.closure is None
            limit = Status.MESSAGE_SIZE_LIMIT_EXCEEDED
            await conn.send(ops.PublishStatus(limit, None, "/a/b", None, "too big"))
            async for note in client.notifications():
                if note.status is NotificationStatus.MESSAGE_SIZE_LIMIT_EXCEEDED:
                    assert (note.subject, note.reason) == ("/a/b", "too big")
                    break
        nursery.cancel_scope.cancel()


@trio_test
async def test_blocking_publisher() -> None:
    async with trio.open_nursery() as nursery:
        (server,) = await start_servers(nursery)

        async def serve_one() -> None:
            conn = await server.next_connection()
            connect_op = await conn.accept_session()
            assert connect_op.token == "secret"
            publish = await conn.expect(ops.Publish)
            await conn.send(ok(publish, 1))
            await conn.closed_by_client()

        nursery.start_soon(serve_one)

        def script() -> PublishResult:
            with Publisher(servers=[server.url], token="secret", reconnect=FAST) as pub:
                return pub.publish("/a/b", b"x", fields={"k": "v"}, retained=True)

        result = await trio.to_thread.run_sync(script)
        assert result.status is Status.PUBLISH_OK and result.position == Position(3, 1)
        nursery.cancel_scope.cancel()


def test_publisher_reports_bad_servers_in_the_caller_thread() -> None:
    with pytest.raises(ValueError, match="bad"), Publisher(servers=["bad"]):
        pass


@trio_test
async def test_a_server_that_does_not_read_ends_the_session() -> None:
    keepalive = Keepalive(interval=60, timeout=0.3)
    async with trio.open_nursery() as nursery:
        server = await FakeServer(max_message_size=2**26).start(nursery)
        async with connect([server.url], reconnect=FAST, keepalive=keepalive) as client:
            conn = await server.next_connection()
            await conn.accept_session()  # and then never reads again
            with pytest.raises(PublishOutcomeUnknown):
                for _ in range(200):
                    await client.publish_nowait("/a/b", bytes(2**20))
            note = await next_down(client)
            assert note.reason is not None and "could not send" in note.reason
            await server.next_connection()  # the client reconnected
        nursery.cancel_scope.cancel()


async def next_down(client: Client) -> Notification:
    async for note in client.notifications():
        if note.status is NotificationStatus.SERVER_DOWN:
            return note
    raise AssertionError("no SERVER_DOWN")


@trio_test
async def test_publishes_cancelled_while_waiting_to_write_end_cancelled() -> None:
    """The application cancels its publishing tasks and the client's own task together
    (a nursery cancelled), as tests/cluster/test_cluster_rebalance.py does at the end of
    its load: a publish waiting (shielded) behind a stalled write is not sent once the
    client closes, and must then end with the cancellation, not go round for a session
    and raise ClientClosedError (the cluster test failed so in CI)."""
    big = b"x" * (4 * 2**20)
    keepalive = Keepalive(interval=30.0, timeout=1.0)
    async with trio.open_nursery() as nursery:
        server = await FakeServer(max_message_size=2**26).start(nursery)

        async def run_client(*, task_status: trio.TaskStatus[Client]) -> None:
            async with connect([server.url], reconnect=FAST, keepalive=keepalive) as client:
                task_status.started(client)
                await trio.sleep_forever()

        async with trio.open_nursery() as application:
            client = await application.start(run_client)
            stalled = await server.next_connection()
            await stalled.accept_session()
            sock = stalled.ws._stream.socket  # type: ignore[attr-defined]  # test-only
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 64 * 1024)
            for content in (big, big, big, b"small"):  # the first write fills the link
                application.start_soon(client.publish, "/a/b", content)
                await trio.testing.wait_all_tasks_blocked()
            application.cancel_scope.cancel()
        # before: ExceptionGroup([ClientClosedError(...), ...]) out of the nursery above
        stalled.released.set()
        nursery.cancel_scope.cancel()
