"""A lost connection always ends the session: SERVER_DOWN, then the next server.

Chaos run ``fix1`` (seed 1): an SDK subscriber whose connection had been reset stayed
"connected" for 80 s -- no SERVER_DOWN, no reconnect, 308 messages lost to it.
"""

from __future__ import annotations

import trio
from sdk_fake_server import trio_test
from sdk_raw_peer import RawPeer, broken_frame

from migratory.model.message import Message, MessageType
from migratory.protocol import ops
from migratory_client import Client, Notification, NotificationStatus, ReconnectPolicy, connect

FAST = ReconnectPolicy(initial_delay=0.02, max_delay=0.1, connect_timeout=2.0)


def message(subject: str, seq: int, epoch: int = 7) -> Message:
    return Message(subject, f"{subject}#{seq}".encode(), epoch=epoch, seq=seq,
                   type=MessageType.UPDATE)


async def next_note(client: Client, status: NotificationStatus) -> Notification:
    async for note in client.notifications():
        if note.status is status:
            return note
    raise AssertionError(f"no {status}")


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
