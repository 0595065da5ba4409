"""The SDK against a real ``migratory serve`` process (127.0.0.1 only, stopped by PID).

A TCP proxy in the test cuts the subscriber's connection while the publisher keeps
publishing straight to the server, so the resume has real messages to recover.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import trio
from listen_ports import listen_port
from sdk_fake_server import FAST, trio_test

from migratory.model.message import Message, MessageType
from migratory.model.position import Position
from migratory_client import (
    Client,
    Keepalive,
    Notification,
    NotificationStatus,
    Subscription,
    connect,
)


class Proxy:
    """Forwards TCP connections to ``127.0.0.1:upstream``; can cut them, refuse new ones,
    or hold them: forward nothing either way and close nothing (a network that dropped
    the connection without telling either end)."""

    def __init__(self, upstream: int) -> None:
        self.upstream = upstream
        self.accepting = True
        self.port = 0
        self._streams: list[trio.SocketStream] = []
        self._released: trio.Event | None = None

    async def start(self, nursery: trio.Nursery) -> Proxy:
        listeners = await nursery.start(
            functools.partial(trio.serve_tcp, self._handle, 0, host="127.0.0.1")
        )
        self.port = listeners[0].socket.getsockname()[1]
        return self

    @property
    def url(self) -> str:
        return f"ws://127.0.0.1:{self.port}"

    async def _handle(self, downstream: trio.SocketStream) -> None:
        if not self.accepting:
            await downstream.aclose()
            return
        upstream = await trio.open_tcp_stream("127.0.0.1", self.upstream)
        self._streams += [downstream, upstream]
        async with trio.open_nursery() as nursery:
            nursery.start_soon(self._pipe, downstream, upstream)
            nursery.start_soon(self._pipe, upstream, downstream)

    def hold(self) -> None:
        self._released = trio.Event()

    def release(self) -> None:
        if self._released is not None:
            self._released.set()
            self._released = None

    async def _pipe(self, source: trio.SocketStream, sink: trio.SocketStream) -> None:
        try:
            async for chunk in source:
                while self._released is not None:
                    await self._released.wait()
                await sink.send_all(chunk)
        except (trio.BrokenResourceError, trio.ClosedResourceError):
            pass
        finally:
            await sink.aclose()

    async def cut(self) -> None:
        for stream in self._streams:
            await stream.aclose()
        self._streams.clear()


async def wait_for(client: Client, status: NotificationStatus) -> Notification:
    async for note in client.notifications():
        if note.status is status:
            return note
    raise AssertionError(f"no {status}")


async def take(subscription: Subscription, count: int) -> list[Message]:
    return [await subscription.next_message() for _ in range(count)]


async def publish(client: Client, subject: str, *contents: str) -> list[Position]:
    positions = []
    for content in contents:
        result = await client.publish(subject, content, retained=True)
        assert result.ok and result.position is not None, result
        positions.append(result.position)
    return positions


def free_port() -> int:
    return listen_port()  # below the ephemeral range: tests/listen_ports.py


@trio_test
async def test_publish_then_subscribe(start_server: Callable[..., Any]) -> None:
    server = await trio.to_thread.run_sync(functools.partial(start_server, BatchTime="0"))
    async with (
        connect([server.url], reconnect=FAST) as subscriber,
        connect([server.url], reconnect=FAST) as publisher,
    ):
        subscription = subscriber.subscribe("/e2e/a")
        await wait_for(subscriber, NotificationStatus.SUBSCRIBE_ALLOW)
        positions = await publish(publisher, "/e2e/a", "one", "two", "three")
        got = await take(subscription, 3)
        assert [m.content for m in got] == [b"one", b"two", b"three"]
        assert [m.position for m in got] == positions
        assert {m.type for m in got} == {MessageType.UPDATE}


@trio_test
async def test_subscriber_drop_resumes_with_exactly_the_missed_messages(
    start_server: Callable[..., Any],
) -> None:
    server = await trio.to_thread.run_sync(functools.partial(start_server, BatchTime="0"))
    async with trio.open_nursery() as nursery:
        proxy = await Proxy(server.port).start(nursery)
        async with (
            connect([proxy.url], reconnect=FAST) as subscriber,
            connect([server.url], reconnect=FAST) as publisher,
        ):
            subscription = subscriber.subscribe("/e2e/b")
            await wait_for(subscriber, NotificationStatus.SUBSCRIBE_ALLOW)
            await publish(publisher, "/e2e/b", "1", "2", "3")
            assert [m.content for m in await take(subscription, 3)] == [b"1", b"2", b"3"]

            proxy.accepting = False
            await proxy.cut()
            await wait_for(subscriber, NotificationStatus.SERVER_DOWN)
            missed = await publish(publisher, "/e2e/b", "4", "5", "6")
            proxy.accepting = True

            sync = await wait_for(subscriber, NotificationStatus.DATA_SYNC)
            assert sync.position == missed[-1]
            await publish(publisher, "/e2e/b", "7")
            got = await take(subscription, 4)
            assert [(m.type, m.content) for m in got] == [
                (MessageType.RECOVERED, b"4"),
                (MessageType.RECOVERED, b"5"),
                (MessageType.RECOVERED, b"6"),
                (MessageType.UPDATE, b"7"),
            ]
            assert [m.position for m in got[:3]] == missed
        nursery.cancel_scope.cancel()


@trio_test
async def test_server_restart_resyncs_to_the_new_epoch(start_server: Callable[..., Any]) -> None:
    port = free_port()
    listen = f"127.0.0.1:{port}"
    first = await trio.to_thread.run_sync(
        functools.partial(start_server, Listen=listen, BatchTime="0")
    )
    async with (
        connect([first.url], reconnect=FAST) as subscriber,
        connect([first.url], reconnect=FAST) as publisher,
    ):
        subscription = subscriber.subscribe("/e2e/c")
        await wait_for(subscriber, NotificationStatus.SUBSCRIBE_ALLOW)
        (old,) = await publish(publisher, "/e2e/c", "before")
        assert (await subscription.next_message()).position == old

        await trio.to_thread.run_sync(first.stop)
        await wait_for(subscriber, NotificationStatus.SERVER_DOWN)
        await trio.to_thread.run_sync(functools.partial(start_server, Listen=listen, BatchTime="0"))
        resync = await wait_for(subscriber, NotificationStatus.DATA_RESYNC)
        assert resync.position is not None and resync.position.epoch != old.epoch

        (new,) = await publish(publisher, "/e2e/c", "after")
        message = await subscription.next_message()
        assert (message.content, message.position, message.type) == (
            b"after",
            new,
            MessageType.UPDATE,
        )
        assert new.epoch == resync.position.epoch


@trio_test
async def test_a_connection_that_goes_silent_ends_by_the_keepalive_and_resumes(
    start_server: Callable[..., Any],
) -> None:
    # The held proxy closes nothing, so only the keepalive can end the session: its
    # SERVER_DOWN ("no pong") is the claim, not how soon it comes (the test's hang
    # guard bounds that). A timeout of 2 s: a loaded box's server still answers pings.
    keepalive = Keepalive(interval=0.5, timeout=2.0)
    server = await trio.to_thread.run_sync(functools.partial(start_server, BatchTime="0"))
    async with trio.open_nursery() as nursery:
        proxy = await Proxy(server.port).start(nursery)
        async with (
            connect(
                [proxy.url], reconnect=FAST, keepalive=keepalive, message_buffer=1
            ) as subscriber,
            connect([server.url], reconnect=FAST) as publisher,
        ):
            subscription = subscriber.subscribe("/e2e/d")
            await wait_for(subscriber, NotificationStatus.SUBSCRIBE_ALLOW)
            await publish(publisher, "/e2e/d", "1", "2", "3")  # the application reads nothing
            await trio.sleep(0.1)
            proxy.accepting = False
            proxy.hold()
            down = await wait_for(subscriber, NotificationStatus.SERVER_DOWN)
            assert "no pong" in (down.reason or ""), down
            missed = await publish(publisher, "/e2e/d", "4", "5")
            proxy.release()
            await proxy.cut()
            proxy.accepting = True
            got = await take(subscription, 5)
            assert [m.content for m in got] == [b"1", b"2", b"3", b"4", b"5"]
            assert [m.position for m in got[3:]] == missed
            assert {m.type for m in got[1:]} == {MessageType.RECOVERED}
        nursery.cancel_scope.cancel()


@trio_test
async def test_a_resume_too_large_for_the_outbox_at_once_still_recovers_every_subject(
    start_server: Callable[..., Any],
) -> None:
    # Together the two subjects' missed messages pass ClientMaxPendingBytes, so the
    # server refuses the reconnect's subscribe whole ("subscribe answer too large");
    # each alone fits. Was: both subjects denied for good, nothing more delivered.
    server = await trio.to_thread.run_sync(
        functools.partial(start_server, BatchTime="0", ClientMaxPendingBytes="65536",
                          MaxMessageSize="32768")
    )
    subjects = ("/e2e/big/a", "/e2e/big/b")
    async with trio.open_nursery() as nursery:
        proxy = await Proxy(server.port).start(nursery)
        async with (
            connect([proxy.url], reconnect=FAST) as subscriber,
            connect([server.url], reconnect=FAST) as publisher,
        ):
            subscription = subscriber.subscribe(*subjects)
            for _ in subjects:
                await wait_for(subscriber, NotificationStatus.SUBSCRIBE_ALLOW)
            proxy.accepting = False
            await proxy.cut()
            await wait_for(subscriber, NotificationStatus.SERVER_DOWN)
            for n in range(10):  # 10 x 4 kB each: 88 kB together, 44 kB alone
                for subject in subjects:
                    content = f"{n:04d}" + "x" * 4000
                    if n < 9:
                        await publisher.publish_nowait(subject, content)
                    else:  # acknowledged after those before it, on one connection
                        await publish(publisher, subject, content)
            proxy.accepting = True
            got = await take(subscription, 20)
            for subject in subjects:
                contents = [m.content[:4] for m in got if m.subject == subject]
                assert contents == [f"{n:04d}".encode() for n in range(10)]
            assert {m.type for m in got} == {MessageType.RECOVERED}
        nursery.cancel_scope.cancel()


@trio_test
async def test_more_subjects_than_one_subscribe_may_carry_are_subscribed_and_resumed(
    start_server: Callable[..., Any],
) -> None:
    # Every subject not yet subscribed goes out when a session opens: was one subscribe
    # of 6 entries, closed with 4000 (terminal) -- the client ended, at its first session.
    server = await trio.to_thread.run_sync(
        functools.partial(start_server, BatchTime="0", MaxSubjectsPerSubscribe="4")
    )
    subjects = [f"/e2e/many/{n}" for n in range(6)]
    async with trio.open_nursery() as nursery:
        proxy = await Proxy(server.port).start(nursery)
        async with (
            connect([proxy.url], reconnect=FAST) as subscriber,
            connect([server.url], reconnect=FAST) as publisher,
        ):
            first = subscriber.subscribe(*subjects[:3])
            second = subscriber.subscribe(*subjects[3:])
            for _ in subjects:
                await wait_for(subscriber, NotificationStatus.SUBSCRIBE_ALLOW)
            await proxy.cut()
            for subject in subjects:
                await publish(publisher, subject, subject)
            for _ in subjects:
                await wait_for(subscriber, NotificationStatus.DATA_SYNC)
            got = await take(first, 3) + await take(second, 3)
            assert sorted(m.content.decode() for m in got) == subjects
            assert subscriber.error is None
        nursery.cancel_scope.cancel()


@trio_test
async def test_a_resume_that_can_never_fit_in_the_outbox_restarts_from_the_snapshot(
    start_server: Callable[..., Any],
) -> None:
    # 20 missed 4 kB messages pass ClientMaxPendingBytes even alone: was denied for good
    server = await trio.to_thread.run_sync(
        functools.partial(start_server, BatchTime="0", ClientMaxPendingBytes="65536",
                          MaxMessageSize="32768")
    )
    async with trio.open_nursery() as nursery:
        proxy = await Proxy(server.port).start(nursery)
        async with (
            connect([proxy.url], reconnect=FAST) as subscriber,
            connect([server.url], reconnect=FAST) as publisher,
        ):
            subscription = subscriber.subscribe("/e2e/huge")
            await wait_for(subscriber, NotificationStatus.SUBSCRIBE_ALLOW)
            proxy.accepting = False
            await proxy.cut()
            await wait_for(subscriber, NotificationStatus.SERVER_DOWN)
            for n in range(19):
                await publisher.publish_nowait("/e2e/huge", f"{n:04d}" + "x" * 4000, retained=True)
            (last,) = await publish(publisher, "/e2e/huge", "0019" + "x" * 4000)
            proxy.accepting = True
            resync = await wait_for(subscriber, NotificationStatus.DATA_RESYNC)
            assert resync.position == last
            assert resync.reason is not None and "too large" in resync.reason
            snapshot = await subscription.next_message()
            assert (snapshot.type, snapshot.position) == (MessageType.SNAPSHOT, last)
            (after,) = await publish(publisher, "/e2e/huge", "after")
            message = await subscription.next_message()
            assert (message.type, message.position) == (MessageType.UPDATE, after)
        nursery.cancel_scope.cancel()
