"""The trio client against a scripted fake server: sessions, reconnects, resume."""

from __future__ import annotations

import random

import pytest
import trio
from sdk_fake_server import FAST, start_servers, subscribed_at, trio_test, update

from migratory.model.message import Message, MessageType
from migratory.model.position import Position
from migratory.protocol import ops
from migratory_client import (
    Client,
    ConnectionClosedError,
    Keepalive,
    Notification,
    NotificationStatus,
    ReconnectPolicy,
    ServerUnavailableError,
    Subscription,
    connect,
)


async def take(subscription: Subscription, count: int) -> list[Message]:
    return [await subscription.next_message() for _ in range(count)]


async def notification(client: Client, status: NotificationStatus) -> Notification:
    async for note in client.notifications():
        if note.status is status:
            return note
    raise AssertionError(f"no {status}")


def seqs(messages: list[Message]) -> list[tuple[str, int]]:
    return [(m.subject, m.seq) for m in messages]


@trio_test
async def test_reconnects_to_the_other_server_and_resumes_each_subject() -> None:
    async with trio.open_nursery() as nursery:
        a, b = await start_servers(nursery, 2)
        servers = [f"100 {a.url}", f"0 {b.url}"]  # b only when a has just failed
        async with connect(servers, name="t", reconnect=FAST, rng=random.Random(1)) as client:
            subscription = client.subscribe("/a/b", "/c/d", history=3)
            first = await a.next_connection()
            assert (await first.accept_session()).client == "t"
            request = await first.expect(ops.Subscribe)
            assert request.subscriptions == (
                ops.SubscriptionRequest("/a/b", None, 3, 0),
                ops.SubscriptionRequest("/c/d", None, 3, 0),
            )
            await first.allow("/a/b", 5, 10)
            await first.allow("/c/d", 6, 0)
            await first.deliver(update("/a/b", 9, 5, MessageType.HISTORICAL))
            await first.deliver(update("/a/b", 11, 5), update("/c/d", 1, 6), update("/a/b", 12, 5))
            got = await take(subscription, 4)
            assert seqs(got) == [("/a/b", 9), ("/a/b", 11), ("/c/d", 1), ("/a/b", 12)]
            assert got[0].type is MessageType.HISTORICAL

            await first.drop()
            second = await b.next_connection()
            await second.accept_session()
            resume = await second.expect(ops.Subscribe)
            assert set(resume.subscriptions) == {
                ops.SubscriptionRequest("/a/b", Position(5, 12), 0, 0),
                ops.SubscriptionRequest("/c/d", Position(6, 1), 0, 0),
            }
            await second.allow("/a/b", 5, 13)
            recovered = [update("/a/b", s, 5, MessageType.RECOVERED) for s in (12, 13)]
            await second.deliver(*recovered)
            await second.send(ops.SubjectStatus(ops.Status.DATA_SYNC, "/a/b", Position(5, 13)))
            await second.deliver(update("/a/b", 14, 5))
            assert seqs(await take(subscription, 2)) == [("/a/b", 13), ("/a/b", 14)]
            assert client.server == b.url

            statuses = []
            async for note in client.notifications():
                statuses.append((note.status, note.server))
                if note.status is NotificationStatus.DATA_SYNC:
                    break
            assert statuses == [
                (NotificationStatus.SERVER_UP, a.url),
                (NotificationStatus.SUBSCRIBE_ALLOW, a.url),
                (NotificationStatus.SUBSCRIBE_ALLOW, a.url),
                (NotificationStatus.SERVER_DOWN, a.url),
                (NotificationStatus.SERVER_UP, b.url),
                (NotificationStatus.SUBSCRIBE_ALLOW, b.url),
                (NotificationStatus.DATA_SYNC, b.url),
            ]
        nursery.cancel_scope.cancel()


@trio_test
async def test_duplicates_are_never_delivered() -> None:
    async with trio.open_nursery() as nursery:
        (server,) = await start_servers(nursery)
        async with connect([server.url], reconnect=FAST) as client:
            subscription, conn = await subscribed_at(server, client, "/a/b", 7, 10)
            await conn.deliver(update("/a/b", 10, 7, MessageType.SNAPSHOT))
            await conn.deliver(update("/a/b", 11))
            await conn.deliver(update("/a/b", 11))
            await conn.deliver(
                update("/a/b", 10, kind=MessageType.RECOVERED),
                update("/a/b", 12, kind=MessageType.RECOVERED),
                update("/a/b", 12),
                update("/a/b", 13),
            )
            got = await take(subscription, 4)
            assert [(m.type, m.seq) for m in got] == [
                (MessageType.SNAPSHOT, 10),
                (MessageType.UPDATE, 11),
                (MessageType.RECOVERED, 12),
                (MessageType.UPDATE, 13),
            ]
        nursery.cancel_scope.cancel()


@trio_test
async def test_gap_resubscribes_from_the_last_position() -> None:
    async with trio.open_nursery() as nursery:
        (server,) = await start_servers(nursery)
        async with connect([server.url], reconnect=FAST) as client:
            subscription = client.subscribe("/a/b", "/c/d")
            conn = await server.next_connection()
            await conn.accept_session()
            await conn.expect(ops.Subscribe)
            await conn.allow("/a/b", 7, 10)
            await conn.allow("/c/d", 7, 0)
            await conn.deliver(update("/a/b", 11), update("/a/b", 13), update("/a/b", 14))
            again = await conn.expect(ops.Subscribe)
            assert again.subscriptions == (ops.SubscriptionRequest("/a/b", Position(7, 11)),)
            await conn.allow("/a/b", 7, 14)
            await conn.deliver(
                *(update("/a/b", s, kind=MessageType.RECOVERED) for s in (12, 13, 14))
            )
            await conn.send(ops.SubjectStatus(ops.Status.DATA_SYNC, "/a/b", Position(7, 14)))
            await conn.deliver(update("/a/b", 15), update("/c/d", 1))
            assert [m.seq for m in await take(subscription, 6)] == [11, 12, 13, 14, 15, 1]
        nursery.cancel_scope.cancel()


@trio_test
async def test_new_epoch_after_resync_is_delivered() -> None:
    async with trio.open_nursery() as nursery:
        (server,) = await start_servers(nursery)
        async with connect([server.url], reconnect=FAST) as client:
            subscription, conn = await subscribed_at(server, client, "/a/b", 7, 3)
            await conn.deliver(update("/a/b", 4))
            await take(subscription, 1)
            await conn.close(1001, "restarting")
            conn = await server.next_connection()
            await conn.accept_session()
            resume = await conn.expect(ops.Subscribe)
            assert resume.subscriptions[0].position == Position(7, 4)
            await conn.allow("/a/b", 99, 1)
            await conn.deliver(update("/a/b", 1, 99, MessageType.SNAPSHOT))
            await conn.send(ops.SubjectStatus(ops.Status.DATA_RESYNC, "/a/b", Position(99, 1)))
            await conn.deliver(update("/a/b", 2, 99))
            got = await take(subscription, 2)
            assert [(m.type, m.epoch, m.seq) for m in got] == [
                (MessageType.SNAPSHOT, 99, 1),
                (MessageType.UPDATE, 99, 2),
            ]
            note = await notification(client, NotificationStatus.DATA_RESYNC)
            assert note.position == Position(99, 1)
        nursery.cancel_scope.cancel()


@trio_test
async def test_terminal_close_code_ends_the_client() -> None:
    async with trio.open_nursery() as nursery:
        (server,) = await start_servers(nursery)
        async with connect([server.url], reconnect=FAST) as client:
            subscription = client.subscribe("/a/b")
            conn = await server.next_connection()
            await conn.expect(ops.Connect)
            await conn.close(4003, "bad token")
            with pytest.raises(ConnectionClosedError) as info:
                await subscription.next_message()
            assert (info.value.code, info.value.reason) == (4003, "bad token")
            assert "CONNECT_DENIED" in str(info.value)
            with pytest.raises(ConnectionClosedError):
                await client.wait_connected()
            with pytest.raises(ConnectionClosedError):
                client.subscribe("/c/d")
            await trio.sleep(0.2)
            assert server.accepted == 1  # no reconnect
        nursery.cancel_scope.cancel()


@trio_test
async def test_slow_consumer_close_reconnects() -> None:
    async with trio.open_nursery() as nursery:
        (server,) = await start_servers(nursery)
        async with connect([server.url], reconnect=FAST) as client:
            conn = await server.next_connection()
            await conn.accept_session()
            await conn.close(4500, "too slow")
            conn = await server.next_connection()
            await conn.accept_session()
            assert await client.wait_connected() == server.url
            note = await notification(client, NotificationStatus.SERVER_DOWN)
            assert note.reason == "closed with 4500 SLOW_CONSUMER: too slow"
        nursery.cancel_scope.cancel()


@trio_test
async def test_missing_pong_is_a_lost_connection() -> None:
    keepalive = Keepalive(interval=0.05, timeout=0.1)
    async with trio.open_nursery() as nursery:
        (server,) = await start_servers(nursery)
        async with connect([server.url], reconnect=FAST, keepalive=keepalive) as client:
            conn = await server.next_connection()
            await conn.accept_session()
            nursery.start_soon(conn.closed_by_client)  # reads, answers pings
            await trio.sleep(0.3)  # pongs come back: the session stays
            assert server.accepted == 1
            conn.auto_pong = False
            conn = await server.next_connection()
            await conn.accept_session()
            note = await notification(client, NotificationStatus.SERVER_DOWN)
            assert note.reason is not None and "pong" in note.reason
        nursery.cancel_scope.cancel()


@trio_test
async def test_gives_up_after_max_attempts() -> None:
    async with trio.open_nursery() as nursery:
        (server,) = await start_servers(nursery)
        url = server.url
        nursery.cancel_scope.cancel()
    policy = ReconnectPolicy(initial_delay=0.01, max_delay=0.02, max_attempts=3)
    async with connect([url], reconnect=policy) as client:  # nobody listens any more
        with pytest.raises(ServerUnavailableError) as info:
            await client.wait_connected()
        assert info.value.attempts == 3


@trio_test
async def test_subscribe_while_connected_and_unsubscribe_on_exit() -> None:
    async with trio.open_nursery() as nursery:
        (server,) = await start_servers(nursery)
        async with connect([server.url], reconnect=FAST) as client:
            conn = await server.next_connection()
            await conn.accept_session()
            await client.wait_connected()
            async with client.subscribe("/a/b", conflation_ms=500) as subscription:
                sent = await conn.expect(ops.Subscribe)
                assert sent.subscriptions == (ops.SubscriptionRequest("/a/b", None, 0, 500),)
                with pytest.raises(ValueError, match="already subscribed"):
                    client.subscribe("/a/b")
            assert (await conn.expect(ops.Unsubscribe)).subjects == ("/a/b",)
            assert not subscription.active
            with pytest.raises(StopAsyncIteration):
                await subscription.next_message()
            client.subscribe("/a/b")  # free again
        nursery.cancel_scope.cancel()


@trio_test
async def test_subscribing_again_right_after_unsubscribing_gets_no_update_of_the_old_one() -> None:
    async with trio.open_nursery() as nursery:
        (server,) = await start_servers(nursery)
        async with connect([server.url], reconnect=FAST) as client:
            conn = await server.next_connection()
            await conn.accept_session()
            async with client.subscribe("/a/b") as old:
                await conn.expect(ops.Subscribe)
                await conn.allow("/a/b", 7, 10)
                await conn.deliver(update("/a/b", 11))
                assert (await old.next_message()).seq == 11
            again = client.subscribe("/a/b", history=2)
            await conn.expect(ops.Unsubscribe)
            await conn.expect(ops.Subscribe)
            await conn.deliver(update("/a/b", 12))  # sent before the server read the unsubscribe
            await conn.allow("/a/b", 7, 12)
            await conn.deliver(*(update("/a/b", s, kind=MessageType.HISTORICAL) for s in (11, 12)))
            await conn.deliver(update("/a/b", 13))
            got = await take(again, 3)  # was: update 12 first, then history 11 and 12 again
            assert [(m.type, m.seq) for m in got] == [
                (MessageType.HISTORICAL, 11),
                (MessageType.HISTORICAL, 12),
                (MessageType.UPDATE, 13),
            ]
        nursery.cancel_scope.cancel()


@trio_test
async def test_close_ends_iteration_quietly() -> None:
    finished = False
    async with trio.open_nursery() as nursery:
        (server,) = await start_servers(nursery)
        async with connect([server.url], reconnect=FAST) as client:
            subscription, conn = await subscribed_at(server, client, "/a/b", 7, 0)
            await conn.deliver(update("/a/b", 1))
            await client.wait_connected()
            await client.aclose()
            assert [m.seq async for m in subscription] == [1]  # drained, then the end
            await trio.sleep(0)  # aclose() must not cancel the application's code
            finished = True
        assert finished
        assert await conn.closed_by_client() == 1000
        nursery.cancel_scope.cancel()


def test_application_errors_are_not_wrapped() -> None:
    async def main() -> None:
        async with connect(["ws://127.0.0.1:9"], reconnect=FAST):
            raise KeyError("mine")

    with pytest.raises(KeyError):
        trio.run(main)


@trio_test
async def test_outer_cancellation_still_closes_politely() -> None:
    async with trio.open_nursery() as nursery:
        (server,) = await start_servers(nursery)

        async def application() -> None:
            with trio.move_on_after(0.2):
                async with connect([server.url], reconnect=FAST):
                    await trio.sleep_forever()

        nursery.start_soon(application)
        conn = await server.next_connection()
        await conn.accept_session()
        with trio.fail_after(1.0):  # well under the 2 s close timeout
            assert await conn.closed_by_client() == 1000
        nursery.cancel_scope.cancel()
