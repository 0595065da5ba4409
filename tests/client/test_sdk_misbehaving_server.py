"""The trio client against servers that misbehave in ways the protocol does not name:
an epoch that changes mid-stream without a status, broken WebSocket framing, a frame
too large, a token provider that fails. The client must hand the application no gap,
no duplicate, and fail over rather than give up."""

from __future__ import annotations

import trio
from sdk_fake_server import start_servers, trio_test, update

from migratory.model.message import MessageType
from migratory.model.position import Position
from migratory.protocol import ops
from migratory_client import Client, NotificationStatus, ReconnectPolicy, connect

FAST = ReconnectPolicy(initial_delay=0.02, max_delay=0.1, connect_timeout=2.0)


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
            subscription = client.subscribe("/a/b")
            conn = await server.next_connection()
            await conn.accept_session()
            await conn.expect(ops.Subscribe)
            await conn.allow("/a/b", 7, 10)
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
