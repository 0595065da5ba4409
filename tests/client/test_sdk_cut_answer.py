"""A connection cut inside a first subscribe's answer, between its SUBSCRIBE_ALLOW and
its snapshot (or history): the next session resumes from the ALLOW's position asking for
the snapshot (the history) as of it, so the application gets it and then every update it
missed -- not the updates alone (docs/protocol.md, "What the SDKs do with a broken
server"). A bystander subject, whose answer was complete, resumes as usual."""

from __future__ import annotations

import pytest
from sdk_fake_server import FAST, trio_test, update
from sdk_raw_peer import RawLink, RawPeer, frame

from migratory.model.message import MessageType
from migratory.model.position import Position
from migratory.protocol import ops
from migratory_client import connect

CUT, BYSTANDER = "/a/b", "/c/d"


def allow(subject: str, position: Position | None = None) -> ops.SubjectStatus:
    return ops.SubjectStatus(ops.Status.SUBSCRIBE_ALLOW, subject, position)


def synced(subject: str, seq: int) -> ops.SubjectStatus:
    return ops.SubjectStatus(ops.Status.DATA_SYNC, subject, Position(7, seq))


def deliver(subject: str, seq: int, kind: MessageType = MessageType.UPDATE) -> ops.Deliver:
    return ops.Deliver((update(subject, seq, kind=kind),))


async def first_session(peer: RawPeer) -> RawLink:
    """The client's first session, its subscribe read (and not answered yet)."""
    link = await peer.accept()
    await link.accept_session()
    await link.expect(ops.Subscribe)
    return link


async def resubscribed(peer: RawPeer) -> tuple[RawLink, tuple[ops.SubscriptionRequest, ...]]:
    """The client's next session and the subscription requests it resumes with."""
    link = await peer.accept()
    await link.accept_session()
    request = await link.expect(ops.Subscribe)
    assert isinstance(request, ops.Subscribe)
    return link, request.subscriptions


@pytest.mark.parametrize("snapshot_bytes", [0, 5], ids=["after-allow", "inside-snapshot"])
@trio_test
async def test_a_cut_before_the_snapshot_gets_the_snapshot_then_the_missed_updates(
    snapshot_bytes: int,
) -> None:
    peer = RawPeer()
    try:
        async with connect([peer.url], reconnect=FAST) as client:
            bystander = client.subscribe(BYSTANDER)
            link = await first_session(peer)
            link.write(allow(BYSTANDER, Position(7, 5)), deliver(BYSTANDER, 6))
            assert (await bystander.next_message()).seq == 6
            cut = client.subscribe(CUT)
            await link.expect(ops.Subscribe)
            snapshot = frame(deliver(CUT, 9, MessageType.SNAPSHOT))[:snapshot_bytes]
            link.write_then_reset(allow(CUT, Position(7, 10)), snapshot)

            again, requests = await resubscribed(peer)
            assert sorted(requests, key=lambda r: r.subject) == [
                ops.SubscriptionRequest(CUT, Position(7, 10), snapshot=True),  # was: no
                ops.SubscriptionRequest(BYSTANDER, Position(7, 6)),
            ]
            again.write(
                allow(CUT),
                deliver(CUT, 9, MessageType.SNAPSHOT),
                deliver(CUT, 11, MessageType.RECOVERED),
                synced(CUT, 11),
                allow(BYSTANDER),
                deliver(BYSTANDER, 7, MessageType.RECOVERED),
                synced(BYSTANDER, 7),
                deliver(CUT, 12),
                deliver(BYSTANDER, 8),
            )
            got = [await cut.next_message() for _ in range(3)]
            assert [(m.type, m.seq) for m in got] == [
                (MessageType.SNAPSHOT, 9),
                (MessageType.RECOVERED, 11),
                (MessageType.UPDATE, 12),
            ]
            got = [await bystander.next_message() for _ in range(2)]
            assert [(m.type, m.seq) for m in got] == [
                (MessageType.RECOVERED, 7),
                (MessageType.UPDATE, 8),
            ]
            assert client.error is None
    finally:
        peer.close()


@trio_test
async def test_a_cut_after_the_snapshot_asks_for_nothing_more() -> None:
    peer = RawPeer()
    try:
        async with connect([peer.url], reconnect=FAST) as client:
            subscription = client.subscribe(CUT)
            link = await first_session(peer)
            link.write(allow(CUT, Position(7, 10)), deliver(CUT, 9, MessageType.SNAPSHOT))
            assert (await subscription.next_message()).type is MessageType.SNAPSHOT
            link.reset()
            again, requests = await resubscribed(peer)
            assert requests == (ops.SubscriptionRequest(CUT, Position(7, 10)),)
            # a server that sends the snapshot again on a plain resume: not delivered
            # twice (was: the old snapshot again, after it)
            again.write(allow(CUT), deliver(CUT, 9, MessageType.SNAPSHOT), synced(CUT, 10),
                        deliver(CUT, 11))
            got = await subscription.next_message()
            assert (got.type, got.seq) == (MessageType.UPDATE, 11)
    finally:
        peer.close()


@trio_test
async def test_a_cut_before_the_history_gets_the_history_then_the_missed_updates() -> None:
    peer = RawPeer()
    try:
        async with connect([peer.url], reconnect=FAST) as client:
            subscription = client.subscribe(CUT, history=3)
            link = await first_session(peer)
            link.write_then_reset(allow(CUT, Position(7, 10)))
            again, requests = await resubscribed(peer)
            # was: a resume without history, which then never came
            assert requests == (ops.SubscriptionRequest(CUT, Position(7, 10), 3),)
            history = tuple(update(CUT, s, kind=MessageType.HISTORICAL) for s in (8, 9, 10))
            again.write(allow(CUT), ops.Deliver(history),
                        deliver(CUT, 11, MessageType.RECOVERED), synced(CUT, 11))
            got = [await subscription.next_message() for _ in range(4)]
            assert [(m.type, m.seq) for m in got] == [
                (MessageType.HISTORICAL, 8),
                (MessageType.HISTORICAL, 9),
                (MessageType.HISTORICAL, 10),
                (MessageType.RECOVERED, 11),
            ]
    finally:
        peer.close()
