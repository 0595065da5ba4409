"""The trio client interrupted in the middle of things: a connection lost in the middle
of a recovered burst, an unsubscribe while a gap is being recovered, a close during the
back-off. These pin what holds (no gap, no duplicate, no hang)."""

from __future__ import annotations

import pytest
import trio
from sdk_fake_server import FAST, start_servers, subscribed_at, trio_test, update

from migratory.model.message import MessageType
from migratory.model.position import Position
from migratory.protocol import ops
from migratory_client import ClientClosedError, NotificationStatus, ReconnectPolicy, connect


@trio_test
async def test_a_connection_lost_in_a_recovered_burst_resumes_after_its_last() -> None:
    async with trio.open_nursery() as nursery:
        (server,) = await start_servers(nursery)
        async with connect([server.url], reconnect=FAST) as client:
            subscription, conn = await subscribed_at(server, client, "/a/b", 7, 10)
            await conn.drop()
            conn = await server.next_connection()
            await conn.accept_session()
            await conn.expect(ops.Subscribe)
            await conn.send(ops.SubjectStatus(ops.Status.SUBSCRIBE_ALLOW, "/a/b", None))
            await conn.deliver(*(update("/a/b", s, kind=MessageType.RECOVERED) for s in (11, 12)))
            await conn.drop()  # 13 and 14 and the DATA_SYNC never came
            conn = await server.next_connection()
            await conn.accept_session()
            resume = await conn.expect(ops.Subscribe)
            assert resume.subscriptions == (ops.SubscriptionRequest("/a/b", Position(7, 12)),)
            await conn.send(ops.SubjectStatus(ops.Status.SUBSCRIBE_ALLOW, "/a/b", None))
            await conn.deliver(*(update("/a/b", s, kind=MessageType.RECOVERED) for s in (13, 14)))
            await conn.send(ops.SubjectStatus(ops.Status.DATA_SYNC, "/a/b", Position(7, 14)))
            await conn.deliver(update("/a/b", 15))
            assert [(await subscription.next_message()).seq for _ in range(5)] == [
                11, 12, 13, 14, 15
            ]
        nursery.cancel_scope.cancel()


@trio_test
async def test_an_unsubscribe_while_a_gap_is_recovered_drops_the_rest_and_others_go_on() -> None:
    async with trio.open_nursery() as nursery:
        (server,) = await start_servers(nursery)
        async with connect([server.url], reconnect=FAST) as client:
            gone = client.subscribe("/a/b")
            kept = client.subscribe("/c/d")
            conn = await server.next_connection()
            await conn.accept_session()
            await conn.expect(ops.Subscribe)
            await conn.allow("/a/b", 7, 10)
            await conn.allow("/c/d", 7, 0)
            await conn.deliver(update("/a/b", 12))  # a gap: resubscribed from 10
            assert (await conn.expect(ops.Subscribe)).subscriptions[0].subject == "/a/b"
            await gone.unsubscribe()
            assert (await conn.expect(ops.Unsubscribe)).subjects == ("/a/b",)
            await conn.send(ops.SubjectStatus(ops.Status.SUBSCRIBE_ALLOW, "/a/b", None))
            await conn.deliver(update("/a/b", 11, kind=MessageType.RECOVERED), update("/c/d", 1))
            await conn.send(ops.SubjectStatus(ops.Status.DATA_SYNC, "/a/b", Position(7, 12)))
            await conn.deliver(update("/c/d", 2))
            assert [(await kept.next_message()).seq for _ in range(2)] == [1, 2]
            with pytest.raises(StopAsyncIteration):
                await gone.next_message()
        nursery.cancel_scope.cancel()


@trio_test
async def test_close_during_the_back_off_returns_at_once_and_nothing_reconnects() -> None:
    slow = ReconnectPolicy(initial_delay=30.0, max_delay=30.0, jitter=0.0)
    async with trio.open_nursery() as nursery:
        (server,) = await start_servers(nursery)
        async with connect([server.url], reconnect=slow) as client:
            subscription = client.subscribe("/a/b")
            conn = await server.next_connection()
            await conn.accept_session()
            await conn.drop()
            async for note in client.notifications():
                if note.status is NotificationStatus.SERVER_DOWN:
                    break
            with trio.fail_after(1):  # not the 30 s back-off
                await client.aclose()
                await client.aclose()  # twice: nothing more
            with pytest.raises(StopAsyncIteration):
                await subscription.next_message()
            with pytest.raises(ClientClosedError):
                await client.publish("/a/b", b"x")
        assert server.accepted == 1
        nursery.cancel_scope.cancel()
