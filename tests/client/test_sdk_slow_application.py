"""An application that reads slowly, or not at all, never holds up the connection.

The session's reader hands messages over without waiting; a subscription whose buffer
is full pauses (its subjects are unsubscribed at the server) and resumes from its
position when the application has taken half of it. Meanwhile statuses, pongs and
closes keep being read.
"""

from __future__ import annotations

import trio
from sdk_fake_server import FAST, FakeConnection, start_servers, subscribed_at, trio_test, update
from trio_websocket import ConnectionClosed

from migratory.model.message import MessageType
from migratory.model.position import Position
from migratory.protocol import ops
from migratory_client import NotificationStatus, Status, connect

LAST = 30


async def serve_subject(conn: FakeConnection, pauses: list[ops.Unsubscribe]) -> None:
    """/a/b holds seqs 1..LAST (epoch 7); answers subscribes and publishes, records pauses."""
    while True:
        try:
            op = await conn.receive()
        except ConnectionClosed:
            return
        if isinstance(op, ops.Subscribe):
            (request,) = op.subscriptions
            since = 0 if request.position is None else request.position.seq
            await conn.allow("/a/b", 7, since)
            kind = MessageType.UPDATE if request.position is None else MessageType.RECOVERED
            await conn.deliver(*[update("/a/b", s, kind=kind) for s in range(since + 1, LAST + 1)])
            await conn.send(ops.SubjectStatus(Status.DATA_SYNC, "/a/b", Position(7, LAST)))
        elif isinstance(op, ops.Unsubscribe):
            pauses.append(op)
        elif isinstance(op, ops.Publish):
            message = op.message
            status = ops.PublishStatus(
                Status.PUBLISH_OK, message.closure, message.subject, Position(3, 1)
            )
            await conn.send(status)


@trio_test
async def test_a_full_buffer_pauses_the_subscription_and_resumes_it_without_loss() -> None:
    pauses: list[ops.Unsubscribe] = []
    async with trio.open_nursery() as nursery:
        (server,) = await start_servers(nursery)
        async with connect([server.url], reconnect=FAST, message_buffer=4) as client:
            subscription = client.subscribe("/a/b")
            conn = await server.next_connection()
            await conn.accept_session()
            nursery.start_soon(serve_subject, conn, pauses)
            with trio.fail_after(2):  # 4 in the buffer, the rest left at the server
                while not pauses:
                    await trio.sleep(0.01)
            assert [p.subjects for p in pauses] == [("/a/b",)]
            with trio.fail_after(2):  # the application does not read: the connection works
                result = await client.publish("/p/q", b"x")
            assert result.ok
            got = []
            while len(got) < LAST:
                got.append(await subscription.next_message())
                await trio.sleep(0.005)
            assert [m.seq for m in got] == list(range(1, LAST + 1))
            assert [m.type for m in got[:4]] == [MessageType.UPDATE] * 4
            assert {m.type for m in got[4:]} == {MessageType.RECOVERED}
            assert len(pauses) >= 2  # paused again after each resume's first 4
        nursery.cancel_scope.cancel()


@trio_test
async def test_a_frame_of_many_messages_is_handed_over_in_one_reader_step() -> None:
    # Chaos run fix1: in a busy process every message handed over cost a trip through
    # the scheduler, and a resubscription's answer took one subject per 1-4 s.
    class ReaderSteps(trio.abc.Instrument):
        steps = 0

        def before_task_step(self, task: trio.lowlevel.Task) -> None:
            if task.name.endswith("Session._read"):
                self.steps += 1

    async with trio.open_nursery() as nursery:
        (server,) = await start_servers(nursery)
        async with connect([server.url], reconnect=FAST) as client:
            subscription, conn = await subscribed_at(server, client, "/a/b", 7, 0)
            await trio.sleep(0.1)
            counter = ReaderSteps()
            trio.lowlevel.add_instrument(counter)
            await conn.deliver(*[update("/a/b", s) for s in range(1, 1001)])
            await conn.send(ops.SubjectStatus(Status.DATA_SYNC, "/a/b", Position(7, 1000)))
            async for note in client.notifications():
                if note.status is NotificationStatus.DATA_SYNC:
                    break
            trio.lowlevel.remove_instrument(counter)
            assert counter.steps < 20, counter.steps
            assert [(await subscription.next_message()).seq for _ in range(1000)] == list(
                range(1, 1001)
            )
        nursery.cancel_scope.cancel()
