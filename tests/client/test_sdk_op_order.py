"""The server gets the application's operations in the order the application made them.

A subscribe is sent by a task of its own (or, between sessions, by the next session's
reader), a publish by the caller's task: a publish made right after a subscribe of its
subject could reach the server first -- trio runs ready tasks in either order -- and
then a fresh subscription does not get the message (it was published before the
subscribe). Found by test_sdk_storms.py (a publish made between sessions, in about a
third of the runs). Each case runs ROUNDS times: trio's scheduling made the wrong order
in about half of the rounds before."""

from __future__ import annotations

import trio
from sdk_fake_server import FAST, trio_test
from sdk_raw_peer import RawLink, RawPeer

from migratory.protocol import ops
from migratory_client import connect

SUBJECT = "/a/b"
ROUNDS = 10


async def ops_after_connect(link: RawLink, count: int) -> list[type]:
    await link.accept_session()
    return [type(await link.receive()) for _ in range(count)]


@trio_test
async def test_a_subscribe_then_a_publish_between_sessions_go_out_in_that_order() -> None:
    for _ in range(ROUNDS):
        peer = RawPeer()
        try:
            async with connect([peer.url], reconnect=FAST) as client, trio.open_nursery() as n:
                client.subscribe(SUBJECT)
                n.start_soon(client.publish_nowait, SUBJECT, "after the subscribe")
                link = await peer.accept()
                assert await ops_after_connect(link, 2) == [ops.Subscribe, ops.Publish]
        finally:
            peer.close()


@trio_test
async def test_a_subscribe_then_a_publish_on_an_open_session_go_out_in_that_order() -> None:
    for _ in range(ROUNDS):
        peer = RawPeer()
        try:
            async with connect([peer.url], reconnect=FAST) as client:
                first = client.subscribe("/x/y")
                link = await peer.accept()
                await ops_after_connect(link, 1)
                await client.wait_connected()
                second = client.subscribe(SUBJECT)
                await client.publish_nowait(SUBJECT, "after the subscribe")
                got = [await link.receive() for _ in range(2)]
                assert [type(op) for op in got] == [ops.Subscribe, ops.Publish]
                await second.unsubscribe()
                await first.unsubscribe()
        finally:
            peer.close()


@trio_test
async def test_a_subscribe_then_its_unsubscribe_go_out_in_that_order() -> None:
    # else the server keeps a subscription the application no longer has (and sends
    # its messages for nothing)
    for _ in range(ROUNDS):
        peer = RawPeer()
        try:
            async with connect([peer.url], reconnect=FAST) as client:
                client.subscribe("/x/y")
                link = await peer.accept()
                await ops_after_connect(link, 1)
                await client.wait_connected()
                subscription = client.subscribe(SUBJECT)
                await subscription.unsubscribe()
                await client.publish_nowait("/x/y", "a marker: everything before is read")
                got = []
                while not got or not isinstance(got[-1], ops.Publish):
                    got.append(await link.receive())
                # the subscribe left out (the subject was gone when its turn came), or
                # sent before the unsubscribe: never after it
                kinds = [type(op) for op in got]
                assert kinds in ([ops.Unsubscribe, ops.Publish],
                                 [ops.Subscribe, ops.Unsubscribe, ops.Publish]), kinds
        finally:
            peer.close()
