"""Scripted sessions of the trio client against a :class:`~sdk_raw_peer.RawPeer`, for the
hostile-server tests (test_sdk_hostile_frames.py, test_sdk_hostile_answers.py): a
subscribe answered, the resume the client's next session must ask for, the next
notification of a status."""

from __future__ import annotations

from sdk_fake_server import update
from sdk_raw_peer import RawLink, RawPeer

from migratory.model.message import MessageType
from migratory.model.position import Position
from migratory.protocol import ops
from migratory_client import Client, Notification, NotificationStatus, Subscription

SUBJECT = "/a/b"


async def next_note(client: Client, status: NotificationStatus) -> Notification:
    async for note in client.notifications():
        if note.status is status:
            return note
    raise AssertionError(f"no {status}")


async def subscribed_raw(
    peer: RawPeer, client: Client, seq: int = 10
) -> tuple[Subscription, RawLink]:
    subscription = client.subscribe(SUBJECT)
    link = await peer.accept()
    await link.accept_session()
    await link.expect(ops.Subscribe)
    link.write(ops.SubjectStatus(ops.Status.SUBSCRIBE_ALLOW, SUBJECT, Position(7, seq)))
    return subscription, link


async def resumed_from(peer: RawPeer, position: Position, *, snapshot: bool = False) -> RawLink:
    """The client's next session resumes SUBJECT from ``position`` (asking for the
    snapshot as of it when the first subscribe's answer was cut before one came)."""
    link = await peer.accept()
    await link.accept_session()
    request = await link.expect(ops.Subscribe)
    assert isinstance(request, ops.Subscribe)
    expected = ops.SubscriptionRequest(SUBJECT, position, snapshot=snapshot)
    assert request.subscriptions == (expected,)
    return link


def recovered(*seqs: int) -> ops.Deliver:
    return ops.Deliver(tuple(update(SUBJECT, s, kind=MessageType.RECOVERED) for s in seqs))
