"""The trio client against a server whose operations are well formed but say what they
must not: messages nobody subscribed to, positions that go back or skip, a DATA_SYNC
that comes before anything was recovered, publish statuses nobody asked for (or twice),
a server that stops reading publishes, a snapshot or history outside a subscribe's
answer, statuses of a subject never subscribed (migratory_client/routing.py,
publisher.py, resume.py). What the application sees: no gap, no duplicate, one outcome
per publish, no notification it did not ask for. Broken frames and connections:
test_sdk_hostile_frames.py."""

from __future__ import annotations

import contextlib

import trio
from sdk_fake_server import FAST, trio_test, update
from sdk_raw_peer import RawLink, RawPeer
from sdk_raw_sessions import SUBJECT, next_note, recovered, resumed_from, subscribed_raw

from migratory.model.message import MessageType
from migratory.model.position import Position
from migratory.protocol import ops
from migratory_client import (
    Client,
    Keepalive,
    Notification,
    NotificationStatus,
    PublishOutcomeUnknown,
    PublishResult,
    connect,
)


@trio_test
async def test_messages_never_subscribed_back_in_time_or_after_a_skip_are_not_delivered() -> None:
    peer = RawPeer()
    try:
        async with connect([peer.url], reconnect=FAST) as client:
            subscription, link = await subscribed_raw(peer, client)
            stranger = update("/x/y", 11)
            link.write(
                ops.Deliver((update(SUBJECT, 11), stranger)),
                ops.Deliver((update(SUBJECT, 12), update(SUBJECT, 11), update(SUBJECT, 9))),
                ops.Deliver((update(SUBJECT, 10, epoch=7), update(SUBJECT, 12))),
                ops.Deliver((update(SUBJECT, 15), update(SUBJECT, 16))),  # 13, 14 skipped
            )
            again = await link.expect(ops.Subscribe)  # the gap: resumed on this session
            assert again.subscriptions == (ops.SubscriptionRequest(SUBJECT, Position(7, 12)),)
            link.write(
                ops.SubjectStatus(ops.Status.SUBSCRIBE_ALLOW, SUBJECT, None),
                recovered(13, 14, 15, 16),
                ops.SubjectStatus(ops.Status.DATA_SYNC, SUBJECT, Position(7, 16)),
                ops.Deliver((update(SUBJECT, 16), update(SUBJECT, 17))),
            )
            got = [await subscription.next_message() for _ in range(7)]
            assert [(m.subject, m.seq) for m in got] == [(SUBJECT, s) for s in range(11, 18)]
            assert subscription._receive.statistics().current_buffer_used == 0
    finally:
        peer.close()

@trio_test
async def test_a_data_sync_before_any_recovered_message() -> None:
    peer = RawPeer()
    try:
        async with connect([peer.url], reconnect=FAST) as client:
            subscription, link = await subscribed_raw(peer, client)
            link.write(ops.Deliver((update(SUBJECT, 11),)))
            assert (await subscription.next_message()).seq == 11
            link.reset()
            again = await resumed_from(peer, Position(7, 11))
            again.write(
                # before the SUBSCRIBE_ALLOW: it answers nothing yet, moves nothing
                ops.SubjectStatus(ops.Status.DATA_SYNC, SUBJECT, Position(7, 13)),
                ops.SubjectStatus(ops.Status.SUBSCRIBE_ALLOW, SUBJECT, None),
                # nothing recovered although 12 and 13 were missed: not a silent gap
                ops.SubjectStatus(ops.Status.DATA_SYNC, SUBJECT, Position(7, 13)),
                ops.Deliver((update(SUBJECT, 14),)),
            )
            assert (await subscription.next_message()).seq == 14
            note = await next_note(client, NotificationStatus.DATA_RESYNC)
            assert note.position == Position(7, 13)
    finally:
        peer.close()


def publish_status(
    closure: str | None, status: ops.Status = ops.Status.PUBLISH_OK
) -> ops.PublishStatus:
    position = Position(7, 99) if status is ops.Status.PUBLISH_OK else None
    return ops.PublishStatus(status, closure, SUBJECT, position)


MARKER = "/z/z"


async def notes_until_marker(client: Client, link: RawLink) -> list[Notification]:
    """The notifications of everything the server wrote before now."""
    link.write(ops.SubjectStatus(ops.Status.SUBSCRIBE_ALLOW, MARKER, Position(1, 0)))
    notes = []
    async for note in client.notifications():
        if note.status is NotificationStatus.SUBSCRIBE_ALLOW and note.subject == MARKER:
            return notes
        notes.append(note)
    raise AssertionError("the client ended")


@trio_test
async def test_each_publish_gets_exactly_one_status_whatever_the_server_answers() -> None:
    peer = RawPeer()
    try:
        async with trio.open_nursery() as nursery, connect([peer.url], reconnect=FAST) as client:
            client.subscribe(MARKER)
            link = await peer.accept()
            await link.accept_session()
            await link.expect(ops.Subscribe)
            results: list[object] = []

            async def publish(timeout: float) -> None:
                try:
                    results.append(await client.publish(SUBJECT, b"x", timeout=timeout))
                except PublishOutcomeUnknown as exc:
                    results.append(exc)

            nursery.start_soon(publish, 5.0)
            closure = (await link.expect(ops.Publish)).message.closure
            link.write(
                publish_status(f"{closure}0"),  # a closure this client never made
                publish_status("someone-else", ops.Status.PUBLISH_FAILED),
                publish_status(closure),
                publish_status(closure),  # twice
                publish_status(closure, ops.Status.PUBLISH_FAILED),  # and then otherwise
            )
            nursery.start_soon(publish, 0.2)  # this one gives up before its status comes
            late = (await link.expect(ops.Publish)).message.closure
            while len(results) < 2:
                await trio.sleep(0.01)
            link.write(publish_status(late), publish_status(late))  # after it gave up, twice
            link.write(publish_status(None, ops.Status.PUBLISH_FAILED))  # a publish_nowait's
            notes = await notes_until_marker(client, link)
            ok, unknown = results
            assert isinstance(ok, PublishResult) and ok.status is ops.Status.PUBLISH_OK
            assert isinstance(unknown, PublishOutcomeUnknown) and unknown.closure == late
            assert [
                (n.status, n.closure) for n in notes if n.status is not NotificationStatus.SERVER_UP
            ] == [
                (NotificationStatus.PUBLISH_OK, late),  # the outcome of the one given up, once
                (NotificationStatus.PUBLISH_FAILED, None),
            ]  # was: 6 more, for closures never made and statuses already given
            assert client._router.stray_publish_statuses == 5
            nursery.cancel_scope.cancel()
    finally:
        peer.close()


@trio_test
async def test_publishes_to_a_server_that_stops_reading_each_get_one_outcome_then_go_on() -> None:
    # 40 publishers of 256 KiB each (10 MiB) to a member that reads nothing: one write is
    # under way, the rest wait for it (the SDK holds no queue of its own); the session is
    # given up after keepalive.timeout; what was never written goes out on the next one.
    # Every later session is answered: on a loaded box one write can take over 0.3 s (the
    # fake shares the client's thread), and that session is then given up too, by contract;
    # the publishes' timeout only bounds a hang (every outcome comes from a session's end)
    keepalive = Keepalive(interval=60, timeout=0.3)
    peer = RawPeer()
    outcomes: list[str] = []
    try:
        async with (
            trio.open_nursery() as nursery,
            connect([peer.url], reconnect=FAST, keepalive=keepalive) as client,
        ):
            stalled = await peer.accept()
            await stalled.accept_session()
            done = trio.Event()

            async def publish() -> None:
                try:
                    result = await client.publish(SUBJECT, bytes(2**18), timeout=30.0)
                    outcomes.append(result.status.value)
                except PublishOutcomeUnknown:
                    outcomes.append("unknown")
                if len(outcomes) == 40:
                    done.set()

            async def answer(link: RawLink) -> None:
                with contextlib.suppress(EOFError, OSError):  # given up: on to the next
                    await link.accept_session()
                    while True:
                        publish_op = await link.expect(ops.Publish)
                        assert isinstance(publish_op, ops.Publish)
                        link.write(publish_status(publish_op.message.closure))

            async def answer_every_session() -> None:
                while True:
                    nursery.start_soon(answer, await peer.accept())

            for _ in range(40):
                nursery.start_soon(publish)
            note = await next_note(client, NotificationStatus.SERVER_DOWN)
            assert note.reason is not None and note.reason.startswith("could not send")
            nursery.start_soon(answer_every_session)
            await done.wait()
            unknown = outcomes.count("unknown")
            assert 1 <= unknown < 40  # written (wholly or in part) to a session given up
            assert outcomes.count("PUBLISH_OK") == 40 - unknown
            nursery.cancel_scope.cancel()
    finally:
        peer.close()


@trio_test
async def test_a_snapshot_or_history_outside_a_subscribes_answer_is_not_delivered() -> None:
    peer = RawPeer()
    try:
        async with connect([peer.url], reconnect=FAST) as client:
            subscription = client.subscribe(SUBJECT, history=2)
            link = await peer.accept()
            await link.accept_session()
            await link.expect(ops.Subscribe)
            snapshot, historical = MessageType.SNAPSHOT, MessageType.HISTORICAL
            link.write(
                ops.SubjectStatus(ops.Status.SUBSCRIBE_ALLOW, SUBJECT, Position(7, 10)),
                ops.Deliver(
                    (update(SUBJECT, 9, kind=historical), update(SUBJECT, 10, kind=historical))
                ),
                ops.Deliver((update(SUBJECT, 10, kind=historical),)),  # the history again
                ops.Deliver((update(SUBJECT, 11), update(SUBJECT, 12))),
                ops.Deliver((update(SUBJECT, 5, kind=snapshot),)),  # an old snapshot
                ops.Deliver((update(SUBJECT, 3, kind=historical), update(SUBJECT, 13))),
            )
            got = [await subscription.next_message() for _ in range(5)]
            assert [(m.type, m.seq) for m in got] == [  # was: 10, 5, 3 among them
                (historical, 9),
                (historical, 10),
                (MessageType.UPDATE, 11),
                (MessageType.UPDATE, 12),
                (MessageType.UPDATE, 13),
            ]
    finally:
        peer.close()


@trio_test
async def test_statuses_of_a_subject_never_subscribed_tell_the_application_nothing() -> None:
    """DATA_SYNC, DATA_RESYNC, SUBSCRIBE_ALLOW and SUBSCRIBE_DENY for a subject this
    client never subscribed to, at any position: no notification; the subscribed subject
    goes on, its own statuses told (attack test: holds before too)."""
    peer = RawPeer()
    try:
        async with connect([peer.url], reconnect=FAST) as client:
            notes: list[Notification] = []
            resynced = trio.Event()

            async def watch() -> None:
                async for note in client.notifications():
                    notes.append(note)
                    if note.status is NotificationStatus.DATA_RESYNC:
                        resynced.set()

            async with trio.open_nursery() as nursery:
                nursery.start_soon(watch)
                subscription, link = await subscribed_raw(peer, client)
                stranger = "/x/y"
                link.write(*(ops.SubjectStatus(status, stranger, position, "r")
                             for status in (ops.Status.DATA_SYNC, ops.Status.DATA_RESYNC,
                                            ops.Status.SUBSCRIBE_ALLOW,
                                            ops.Status.SUBSCRIBE_DENY)
                             for position in (None, Position(3, 2**40), Position(7, 1))),
                           ops.Deliver((update(SUBJECT, 11),)),
                           ops.SubjectStatus(ops.Status.DATA_RESYNC, SUBJECT, Position(7, 11)),
                           ops.Deliver((update(SUBJECT, 12),)))
                got = [await subscription.next_message() for _ in range(2)]
                assert [m.seq for m in got] == [11, 12]
                await resynced.wait()
                nursery.cancel_scope.cancel()
            assert [n for n in notes if n.subject == stranger] == []
            assert [n.status for n in notes if n.subject == SUBJECT] == [
                NotificationStatus.SUBSCRIBE_ALLOW, NotificationStatus.DATA_RESYNC]
            assert client.error is None
    finally:
        peer.close()
