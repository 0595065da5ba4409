"""A lost connection always ends the session: SERVER_DOWN, then the next server.

Chaos run ``fix1`` (seed 1): an SDK subscriber whose connection had been reset stayed
"connected" for 80 s -- no SERVER_DOWN, no reconnect, 308 messages lost to it.
"""

from __future__ import annotations

import trio
from sdk_fake_server import FAST, trio_test
from sdk_raw_peer import RawPeer, broken_frame
from sdk_raw_sessions import next_note

from migratory.model.message import Message, MessageType
from migratory.model.position import Position
from migratory.protocol import ops
from migratory_client import (
    Keepalive,
    NotificationStatus,
    connect,
)


def message(subject: str, seq: int, epoch: int = 7) -> Message:
    return Message(subject, f"{subject}#{seq}".encode(), epoch=epoch, seq=seq,
                   type=MessageType.UPDATE)


@trio_test
async def test_a_session_ended_while_frames_wait_unread_and_the_peer_reset_reconnects() -> None:
    # The client must end the session (the server broke the protocol) while
    # trio-websocket still holds frames nobody will read, and its close frame cannot be
    # written (the peer reset the connection). trio-websocket 0.12.2 then never lets go
    # of the connection: its reader waits forever to hand the next frame over.
    peer = RawPeer()
    try:
        async with connect([peer.url], reconnect=FAST) as client:
            first = await peer.accept()
            await first.expect(ops.Connect)
            unknown = [ops.Deliver((message("/x/y", seq),)) for seq in range(1, 5)]
            first.write_then_reset(
                ops.Connected("raw"), unknown[0], unknown[1], broken_frame(), *unknown[2:]
            )
            with trio.fail_after(3):
                down = await next_note(client, NotificationStatus.SERVER_DOWN)
                assert "broke the protocol" in (down.reason or "")
                second = await peer.accept()
                await second.accept_session()
                await next_note(client, NotificationStatus.SERVER_UP)
    finally:
        peer.close()


async def silent_after_a_backlog(peer: RawPeer, messages: int, frames: int) -> None:
    """Accept the session, answer the subscription with ``messages`` in ``frames`` frames,
    then go silent (read nothing, answer nothing, close nothing)."""
    link = await peer.accept()
    await link.accept_session()
    subscribe = await link.expect(ops.Subscribe)
    assert isinstance(subscribe, ops.Subscribe)
    per_frame = messages // frames
    batches = [
        ops.Deliver(tuple(message("/a/b", s) for s in range(first, first + per_frame)))
        for first in range(1, messages + 1, per_frame)
    ]
    allow = ops.SubjectStatus(ops.Status.SUBSCRIBE_ALLOW, "/a/b", Position(7, 0))
    link.write(allow, *batches)


KEEPALIVE = Keepalive(interval=0.2, timeout=0.3)
"""The peer goes silent and closes nothing: only the keepalive can end the session. What
the tests claim is that it does ("no pong"), and before the application has read the
backlog -- not how many seconds it took (the test's hang guard bounds that)."""


@trio_test
async def test_a_silent_connection_ends_the_session_while_the_application_does_not_read() -> None:
    peer = RawPeer()
    try:
        async with connect(
            [peer.url], reconnect=FAST, keepalive=KEEPALIVE, message_buffer=5
        ) as client:
            client.subscribe("/a/b")  # and never read
            await silent_after_a_backlog(peer, messages=50, frames=10)
            down = await next_note(client, NotificationStatus.SERVER_DOWN)
            assert "no pong" in (down.reason or ""), down
    finally:
        peer.close()


@trio_test
async def test_a_silent_connection_ends_the_session_while_the_application_reads_slowly() -> None:
    peer = RawPeer()
    try:
        async with (
            connect([peer.url], reconnect=FAST, keepalive=KEEPALIVE, message_buffer=200) as client,
            trio.open_nursery() as nursery,
        ):
            subscription = client.subscribe("/a/b")
            read: list[Message] = []

            async def slow_application() -> None:
                async for m in subscription:
                    read.append(m)
                    await trio.sleep(0.02)  # 200 messages held: 4 s of reading, 8 x the keepalive

            nursery.start_soon(slow_application)
            await silent_after_a_backlog(peer, messages=200, frames=40)
            down = await next_note(client, NotificationStatus.SERVER_DOWN)
            assert "no pong" in (down.reason or ""), down
            assert len(read) < 200, "ended only once the application had caught up"
            nursery.cancel_scope.cancel()
    finally:
        peer.close()
