"""A server frame of many messages must not stop the application: the trio client
decodes a large frame in a worker thread and hands its messages over in slices, with a
checkpoint between (a 64 MiB batch of small messages is 1.4 million of them: 10-30 s of
Python work, during which no other task of the application ran)."""

from __future__ import annotations

from collections.abc import Sequence

import pytest
import trio
from sdk_fake_server import FAST, trio_test, update
from sdk_raw_peer import RawPeer

from migratory.model.message import Message
from migratory.model.position import Position
from migratory.protocol import ops
from migratory_client import connect
from migratory_client import session as session_module

SUBJECT = "/a/b"
COUNT = 40_000


@trio_test
async def test_a_batch_of_many_messages_leaves_the_applications_other_tasks_running(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    ticks = 0  # steps of another task of the application
    decoded_between: list[tuple[int, int]] = []
    handed_over_at: list[int] = []
    decode = session_module.decode_server_op

    def decode_counting(payload: bytes) -> ops.ServerOp:
        before = ticks
        op = decode(payload)
        if len(payload) > 2**20:  # the batch below (about 2.2 MiB)
            decoded_between.append((before, ticks))
        return op

    async def other_task() -> None:
        nonlocal ticks
        while True:
            ticks += 1
            await trio.sleep(0)

    monkeypatch.setattr(session_module, "decode_server_op", decode_counting)
    peer = RawPeer()
    try:
        async with (
            trio.open_nursery() as nursery,
            connect([peer.url], reconnect=FAST, message_buffer=COUNT) as client,
        ):
            subscription = client.subscribe(SUBJECT)
            link = await peer.accept()
            await link.accept_session()
            await link.expect(ops.Subscribe)
            link.write(ops.SubjectStatus(ops.Status.SUBSCRIBE_ALLOW, SUBJECT, Position(7, 0)))
            on_messages = client._router.on_messages

            def counting(messages: Sequence[Message]) -> object:
                handed_over_at.append(ticks)
                return on_messages(messages)

            monkeypatch.setattr(client._router, "on_messages", counting)
            nursery.start_soon(other_task)
            batch = ops.Deliver(tuple(update(SUBJECT, seq) for seq in range(1, COUNT + 1)))
            link.write(batch)
            got = [(await subscription.next_message()).seq for _ in range(COUNT)]
            assert got == list(range(1, COUNT + 1))
            ((before, after),) = decoded_between
            assert after > before  # was: equal, the decode held the event loop
            assert len(handed_over_at) > 1  # was: 1, all at once
            assert handed_over_at[-1] > handed_over_at[0]  # the other task ran between
            nursery.cancel_scope.cancel()
    finally:
        peer.close()
