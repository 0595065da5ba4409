"""The trio client against servers that misbehave in ways the protocol does not name:
an epoch that changes mid-stream without a status, broken WebSocket framing, a frame
too large, a token provider that fails. The client must hand the application no gap,
no duplicate, and fail over rather than give up."""

from __future__ import annotations

import pytest
import trio
from sdk_fake_server import FAST, start_servers, subscribed_at, trio_test, update
from sdk_raw_peer import RawPeer, frame

from migratory.model.message import MessageType
from migratory.model.position import Position
from migratory.protocol import ops
from migratory_client import (
    Client,
    Keepalive,
    NotificationStatus,
    ReconnectPolicy,
    ServerUnavailableError,
    connect,
)
from migratory_client import client as client_module


async def statuses(client: Client, count: int) -> list[NotificationStatus]:
    seen = []
    async for note in client.notifications():
        seen.append(note.status)
        if len(seen) == count:
            break
    return seen


@trio_test
async def test_an_epoch_change_in_the_middle_of_a_lineage_is_resumed_not_delivered() -> None:
    async with trio.open_nursery() as nursery:
        (server,) = await start_servers(nursery)
        async with connect([server.url], reconnect=FAST) as client:
            subscription, conn = await subscribed_at(server, client, "/a/b", 7, 10)
            await conn.deliver(update("/a/b", 11))
            # the member moved /a/b to epoch 8 at seq 4 and fans out seq 5 as it is
            await conn.deliver(update("/a/b", 5, epoch=8), update("/a/b", 6, epoch=8))
            again = await conn.expect(ops.Subscribe)
            assert again.subscriptions == (ops.SubscriptionRequest("/a/b", Position(7, 11)),)
            await conn.send(ops.SubjectStatus(ops.Status.SUBSCRIBE_ALLOW, "/a/b", None))
            await conn.deliver(update("/a/b", 6, epoch=8, kind=MessageType.SNAPSHOT))
            await conn.send(ops.SubjectStatus(ops.Status.DATA_RESYNC, "/a/b", Position(8, 6)))
            await conn.deliver(update("/a/b", 7, epoch=8))
            got = [await subscription.next_message() for _ in range(3)]
            assert [(m.type, m.epoch, m.seq) for m in got] == [
                (MessageType.UPDATE, 7, 11),
                (MessageType.SNAPSHOT, 8, 6),
                (MessageType.UPDATE, 8, 7),
            ]
            assert NotificationStatus.DATA_RESYNC in await statuses(client, 4)
        nursery.cancel_scope.cancel()


# Frames trio-websocket refuses by itself: it reports them as a close reason, as if
# the server had sent it (1002, 1007; 1009 for a message over the client's limit).
BAD_FRAMES = {
    "masked": bytes([0x82, 0x82, 1, 2, 3, 4, 0, 0]),
    "reserved bits": bytes([0xF2, 0x00]),
    "unknown opcode": bytes([0x83, 0x00]),
    "invalid UTF-8": bytes([0x81, 0x02, 0xFF, 0xFE]),
    "too large": frame(ops.Connected("x" * 2000)),
}


@pytest.mark.parametrize("bad", BAD_FRAMES.values(), ids=BAD_FRAMES.keys())
@trio_test
async def test_a_frame_the_websocket_layer_refuses_fails_over_instead_of_ending(
    bad: bytes, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(client_module, "MAX_FRAME_BYTES", 1000)
    peer = RawPeer()
    try:
        async with connect([peer.url], reconnect=FAST) as client:
            link = await peer.accept()
            await link.accept_session()
            await client.wait_connected()
            link.write(bad)
            again = await peer.accept()  # was: the client ended with 1002/1007/1009
            await again.accept_session()
            assert await client.wait_connected() == peer.url
            assert client.error is None
            async for note in client.notifications():
                if note.status is NotificationStatus.SERVER_DOWN:
                    assert note.reason is not None
                    assert note.reason.startswith("bad frame from the server (10")
                    break
    finally:
        peer.close()


@trio_test
async def test_a_token_provider_that_fails_or_hangs_is_a_failed_attempt_retried() -> None:
    calls = 0

    async def provider() -> str:
        nonlocal calls
        calls += 1
        if calls == 1:
            raise RuntimeError("auth server down")  # was: raised out of connect()
        if calls == 2:
            await trio.sleep_forever()  # was: no session ever again
        return "fresh"

    policy = ReconnectPolicy(initial_delay=0.02, max_delay=0.1, connect_timeout=0.2)
    async with trio.open_nursery() as nursery:
        (server,) = await start_servers(nursery)
        async with connect([server.url], reconnect=policy, token_provider=provider) as client:
            conn = await server.next_connection()
            assert (await conn.accept_session()).token == "fresh"
            assert server.accepted == 1  # asked before connecting
            reasons = []
            async for note in client.notifications():
                if note.status is NotificationStatus.SERVER_UP:
                    break
                reasons.append(note.reason)
            assert reasons == [
                "token provider failed: RuntimeError('auth server down')",
                "token provider gave no token within 0.2 s",
            ]
        nursery.cancel_scope.cancel()


@trio_test
async def test_a_token_provider_that_keeps_failing_counts_towards_max_attempts() -> None:
    def provider() -> str:
        raise RuntimeError("no token")

    policy = ReconnectPolicy(initial_delay=0.01, max_delay=0.02, max_attempts=2)
    async with connect(["ws://127.0.0.1:9"], reconnect=policy, token_provider=provider) as client:
        with pytest.raises(ServerUnavailableError) as info:
            await client.wait_connected()
        assert info.value.attempts == 2
        assert "no token" in str(info.value)


@trio_test
async def test_sessions_the_server_ends_at_once_back_off_and_count_as_failed_attempts() -> None:
    # A member that answers 'connected' and then closes (a crash on the resubscribe, an
    # INTERNAL_ERROR loop): the back-off was reset by every handshake, so the client
    # came back every initial_delay for ever, and max_attempts never ended it.
    policy = ReconnectPolicy(initial_delay=0.01, max_delay=0.02, max_attempts=3)
    async with trio.open_nursery() as nursery:
        (server,) = await start_servers(nursery)
        async with connect([server.url], reconnect=policy) as client:
            for _ in range(3):
                conn = await server.next_connection()
                await conn.accept_session()
                await conn.close(1011, "internal error")
            with pytest.raises(ServerUnavailableError) as info:
                await client.wait_connected()
            assert info.value.attempts == 3
        nursery.cancel_scope.cancel()


@trio_test
async def test_sessions_that_stayed_up_reset_the_back_off_however_they_ended() -> None:
    # A rolling restart: each member the client lands on is drained within seconds, a
    # healthy session each time. Before, only a session that answered a keepalive ping
    # (the first at 15 s) reset the back-off: these sessions counted as failed attempts,
    # the delays grew, and max_attempts ended a client that had been served all along.
    policy = ReconnectPolicy(initial_delay=0.01, max_delay=0.02, max_attempts=2,
                             healthy_after=0.2)
    async with trio.open_nursery() as nursery:
        (server,) = await start_servers(nursery)
        async with connect([server.url], reconnect=policy) as client:
            for _ in range(4):  # more sessions than max_attempts: each one was good
                with trio.fail_after(5):  # a hang guard (before: no next connection)
                    conn = await server.next_connection()
                await conn.accept_session()
                await trio.sleep(0.3)  # up past healthy_after, no ping yet (15 s)
                await conn.close(4502, "drained")
            with trio.fail_after(5):
                await server.next_connection()
            assert client.error is None
        nursery.cancel_scope.cancel()


@trio_test
async def test_a_session_that_answers_a_ping_and_drops_soon_is_still_backed_off() -> None:
    # A member in a crash loop that answers pings (or a client with fast pings): before,
    # an answered ping reset the back-off, so the client came back every initial_delay
    policy = ReconnectPolicy(initial_delay=0.01, max_delay=0.02, max_attempts=2)
    keepalive = Keepalive(interval=0.02, timeout=1.0)
    async with trio.open_nursery() as nursery:
        (server,) = await start_servers(nursery)
        async with connect([server.url], reconnect=policy, keepalive=keepalive) as client:
            for _ in range(2):
                conn = await server.next_connection()
                await conn.accept_session()
                ping = ops.decode_client_op(await conn.ws.get_message())
                assert isinstance(ping, ops.Ping)
                await conn.send(ops.Pong(ping.id))  # read before the close frame
                await conn.close(1011, "internal error")
            # ended by the second (before: reset by each pong, it went on to a third)
            with trio.fail_after(5), pytest.raises(ServerUnavailableError) as info:
                await client.wait_connected()
            assert info.value.attempts == 2
        nursery.cancel_scope.cancel()


def too_large(subject: str) -> ops.SubjectStatus:
    return ops.SubjectStatus(
        ops.Status.SUBSCRIBE_DENY, subject, reason=f"{ops.SUBSCRIBE_TOO_LARGE}: about 9 bytes"
    )


@trio_test
async def test_a_resume_refused_whole_as_too_large_is_asked_for_one_subject_at_a_time() -> None:
    async with trio.open_nursery() as nursery:
        (server,) = await start_servers(nursery)
        async with connect([server.url], reconnect=FAST) as client:
            subscription = client.subscribe("/a/b", "/c/d", "/e/f")
            conn = await server.next_connection()
            await conn.accept_session()
            await conn.expect(ops.Subscribe)
            for subject in ("/a/b", "/c/d", "/e/f"):
                await conn.allow(subject, 7, 10)
            await conn.drop()
            fresh = client.subscribe("/g/h", history=5)  # first subscribed by the next session

            conn = await server.next_connection()
            await conn.accept_session()
            assert len((await conn.expect(ops.Subscribe)).subscriptions) == 4
            for subject in ("/a/b", "/c/d", "/e/f", "/g/h"):  # was: all denied for good
                await conn.send(too_large(subject))
            for subject in ("/a/b", "/c/d"):  # each once the answer before is complete
                again = await conn.expect(ops.Subscribe)
                assert again.subscriptions == (  # cut before a snapshot: asked for
                    ops.SubscriptionRequest(subject, Position(7, 10), snapshot=True),
                )
                await conn.send(ops.SubjectStatus(ops.Status.SUBSCRIBE_ALLOW, subject, None))
                await conn.deliver(update(subject, 11, kind=MessageType.RECOVERED))
                await conn.send(ops.SubjectStatus(ops.Status.DATA_SYNC, subject, Position(7, 11)))
            alone = await conn.expect(ops.Subscribe)
            assert alone.subscriptions == (
                ops.SubscriptionRequest("/e/f", Position(7, 10), snapshot=True),
            )
            await conn.send(too_large("/e/f"))  # a resume too large alone: from the snapshot
            restart = await conn.expect(ops.Subscribe)
            assert restart.subscriptions == (ops.SubscriptionRequest("/e/f", None, 0),)
            await conn.allow("/e/f", 7, 30)
            await conn.deliver(update("/e/f", 30, kind=MessageType.SNAPSHOT))
            alone = await conn.expect(ops.Subscribe)
            assert alone.subscriptions == (ops.SubscriptionRequest("/g/h", None, 5),)
            await conn.send(too_large("/g/h"))  # a first subscribe too large alone: denied
            await conn.deliver(update("/e/f", 31))
            got = [await subscription.next_message() for _ in range(4)]
            assert [(m.subject, m.type, m.seq) for m in got] == [
                ("/a/b", MessageType.RECOVERED, 11),
                ("/c/d", MessageType.RECOVERED, 11),
                ("/e/f", MessageType.SNAPSHOT, 30),
                ("/e/f", MessageType.UPDATE, 31),
            ]
            await conn.drop()

            conn = await server.next_connection()
            await conn.accept_session()
            request = await conn.expect(ops.Subscribe)
            assert [r.subject for r in request.subscriptions] == ["/a/b", "/c/d", "/e/f"]
            told, kinds = [], (NotificationStatus.SUBSCRIBE_DENY, NotificationStatus.DATA_RESYNC)
            async for note in client.notifications():
                if note.status in kinds:
                    told.append((note.status, note.subject))
                if note.status is NotificationStatus.SERVER_UP and told:
                    break
            assert told == [  # the refusals of the whole subscribe are not told
                (NotificationStatus.DATA_RESYNC, "/e/f"),
                (NotificationStatus.SUBSCRIBE_DENY, "/g/h"),
            ]
            assert fresh.active
        nursery.cancel_scope.cancel()


@trio_test
async def test_a_server_that_never_answers_connect_or_answers_something_else_is_left() -> None:
    policy = ReconnectPolicy(initial_delay=0.01, max_delay=0.02, connect_timeout=0.2)
    async with trio.open_nursery() as nursery:
        (server,) = await start_servers(nursery)
        async with connect([server.url], reconnect=policy) as client:
            silent = await server.next_connection()
            await silent.expect(ops.Connect)  # and no answer
            wrong = await server.next_connection()
            await wrong.expect(ops.Connect)
            await wrong.send(ops.Pong(1))
            good = await server.next_connection()
            await good.accept_session()
            assert await client.wait_connected() == server.url
            reasons = []
            async for note in client.notifications():
                if note.status is NotificationStatus.SERVER_UP:
                    break
                reasons.append(note.reason)
            assert reasons == [
                "handshake failed: no 'connected' within 0.2 s",
                "handshake failed: expected 'connected', got Pong(id=1)",
            ]
        nursery.cancel_scope.cancel()


@trio_test
async def test_a_subscribe_is_split_to_the_servers_limit_or_else_to_100_entries() -> None:
    subjects = [f"/a/{n}" for n in range(150)]
    async with trio.open_nursery() as nursery:
        (server,) = await start_servers(nursery)
        async with connect([server.url], reconnect=FAST) as client:
            client.subscribe(*subjects)
            conn = await server.next_connection()
            await conn.accept_session()  # says no limit
            sizes = [len((await conn.expect(ops.Subscribe)).subscriptions) for _ in range(2)]
            assert sizes == [100, 50]
            await conn.drop()
            conn = await server.next_connection()
            await conn.expect(ops.Connect)
            await conn.send(ops.Connected("fake", max_subjects_per_subscribe=60))
            sizes = [len((await conn.expect(ops.Subscribe)).subscriptions) for _ in range(3)]
            assert sizes == [60, 60, 30]
        nursery.cancel_scope.cancel()


@trio_test
async def test_a_data_sync_past_the_recovered_messages_is_told_as_a_resync() -> None:
    async with trio.open_nursery() as nursery:
        (server,) = await start_servers(nursery)
        async with connect([server.url], reconnect=FAST) as client:
            subscription, conn = await subscribed_at(server, client, "/a/b", 7, 10)
            await conn.drop()
            conn = await server.next_connection()
            await conn.accept_session()
            await conn.expect(ops.Subscribe)
            await conn.send(ops.SubjectStatus(ops.Status.SUBSCRIBE_ALLOW, "/a/b", None))
            await conn.deliver(update("/a/b", 11, kind=MessageType.RECOVERED))  # 12-14 lost
            await conn.send(ops.SubjectStatus(ops.Status.DATA_SYNC, "/a/b", Position(7, 14)))
            await conn.deliver(update("/a/b", 15))
            got = [await subscription.next_message() for _ in range(2)]
            assert [m.seq for m in got] == [11, 15]
            async for note in client.notifications():  # was: DATA_SYNC, a silent gap
                assert note.status is not NotificationStatus.DATA_SYNC
                if note.status is NotificationStatus.DATA_RESYNC:
                    assert note.position == Position(7, 14)
                    assert note.reason == (
                        "DATA_SYNC at 7:14 but the last message delivered was 7:11"
                    )
                    break
        nursery.cancel_scope.cancel()


@trio_test
async def test_a_pong_for_a_ping_not_sent_yet_does_not_keep_a_dead_connection_alive() -> None:
    keepalive = Keepalive(interval=0.05, timeout=0.1)
    async with trio.open_nursery() as nursery:
        (server,) = await start_servers(nursery)
        async with connect([server.url], reconnect=FAST, keepalive=keepalive) as client:
            conn = await server.next_connection()
            await conn.accept_session()
            await conn.send(ops.Pong(10**6))  # was: pings 1..10**6 counted as answered
            conn.auto_pong = False
            nursery.start_soon(conn.closed_by_client)
            again = await server.next_connection()  # within interval + timeout
            await again.accept_session()
            async for note in client.notifications():
                if note.status is NotificationStatus.SERVER_DOWN:
                    assert note.reason is not None and "pong" in note.reason
                    break
        nursery.cancel_scope.cancel()
