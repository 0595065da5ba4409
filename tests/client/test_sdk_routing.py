"""Router: handing messages over without waiting, pausing a full subscription, and which
subject statuses may move a position."""

from __future__ import annotations

import trio

from migratory.model.message import Message, MessageType
from migratory.model.position import Position
from migratory.protocol.ops import Status, SubjectStatus
from migratory_client.notifications import NotificationQueue
from migratory_client.resume import SubjectTracker
from migratory_client.routing import Outlet, Router

SUBJECT = "/a/b"
SESSION = 1


def msg(seq: int, kind: MessageType = MessageType.UPDATE) -> Message:
    return Message(SUBJECT, str(seq).encode(), epoch=7, seq=seq, type=kind)


def recovered(*seqs: int) -> list[Message]:
    return [msg(s, MessageType.RECOVERED) for s in seqs]


class Harness:
    def __init__(self, buffer: int) -> None:
        self.router = Router(NotificationQueue(100))
        send, self.receive = trio.open_memory_channel[Message](buffer)
        self.outlet = Outlet(send)
        self.tracker = SubjectTracker(SUBJECT)
        self.router.add([self.tracker], self.outlet)
        self.taken: list[int] = []

    def subscribe(self) -> None:
        """What the session does: request the subject and record it as sent."""
        requests = self.router.requests_for(SESSION)
        assert [r.subject for r in requests] == [SUBJECT]
        self.router.sent(SESSION, requests)

    def status(self, status: Status, seq: int | None = None) -> None:
        position = None if seq is None else Position(7, seq)
        self.router.on_subject_status(SubjectStatus(status, SUBJECT, position), "ws://s", SESSION)

    def take(self, count: int) -> None:
        """What the application does: take messages, resume a paused subscription."""
        for _ in range(count):
            self.taken.append(self.receive.receive_nowait().seq)
        if self.outlet.paused:
            assert self.router.resume(self.outlet) == (SUBJECT,)


def test_a_full_buffer_pauses_instead_of_waiting() -> None:
    h = Harness(buffer=2)
    h.subscribe()
    h.status(Status.SUBSCRIBE_ALLOW, 0)
    reaction = h.router.on_messages([msg(1), msg(2), msg(3), msg(4)])
    assert reaction.pause == (SUBJECT,) and reaction.resubscribe == ()
    assert h.tracker.position == Position(7, 2)  # where the buffered messages end
    assert h.router.on_messages([msg(5)]).pause == ()  # paused: dropped quietly
    assert h.router.requests_for(SESSION) == []  # not resubscribed while paused
    h.status(Status.DATA_SYNC, 5)  # the server's answer, sent before our unsubscribe
    assert h.tracker.position == Position(7, 2)
    h.take(2)
    (request,) = h.router.requests_for(SESSION)
    assert request.position == Position(7, 2)


def test_a_status_answering_an_earlier_request_does_not_move_a_resumed_subject() -> None:
    h = Harness(buffer=2)
    h.subscribe()
    h.status(Status.SUBSCRIBE_ALLOW, 0)
    h.router.on_messages([msg(1)])
    gap = h.router.on_messages([msg(3)])  # 2 is missing: resubscribe from 1
    assert [r.position for r in gap.resubscribe] == [Position(7, 1)]
    h.router.sent(SESSION, gap.resubscribe)
    h.status(Status.SUBSCRIBE_ALLOW)
    assert h.router.on_messages(recovered(2, 3, 4)).pause == (SUBJECT,)  # 3 and 4 dropped
    h.take(2)  # resumed before the gap's DATA_SYNC arrived
    resume = h.router.requests_for(SESSION)
    assert [r.position for r in resume] == [Position(7, 2)]
    h.router.sent(SESSION, resume)
    h.status(Status.DATA_SYNC, 4)  # answers the gap's request: 3 and 4 never came through
    assert h.tracker.position == Position(7, 2)
    h.status(Status.SUBSCRIBE_ALLOW)
    h.router.on_messages(recovered(3, 4))
    h.status(Status.DATA_SYNC, 4)
    assert h.tracker.position == Position(7, 4) and not h.tracker.recovering
    h.take(2)
    assert h.taken == [1, 2, 3, 4]


def test_an_unsolicited_resync_still_moves_the_position() -> None:
    h = Harness(buffer=10)
    h.subscribe()
    h.status(Status.SUBSCRIBE_ALLOW, 0)
    h.router.on_messages([msg(1)])
    h.status(Status.DATA_RESYNC, 40)  # a member's cache sync jumped ahead, said so
    assert h.tracker.position == Position(7, 40)


def test_requests_of_an_earlier_session_are_not_awaited() -> None:
    h = Harness(buffer=10)
    h.subscribe()  # session 1 ends before any answer
    h.router.session_lost("gone")
    h.router.on_subject_status(
        SubjectStatus(Status.SUBSCRIBE_ALLOW, SUBJECT, Position(7, 0)), "ws://t", SESSION + 1
    )
    h.router.on_subject_status(
        SubjectStatus(Status.DATA_SYNC, SUBJECT, Position(7, 3)), "ws://t", SESSION + 1
    )
    assert h.tracker.position == Position(7, 3)


def test_a_status_between_a_resume_and_its_request_does_not_move_the_position() -> None:
    h = Harness(buffer=1)
    h.subscribe()
    h.status(Status.SUBSCRIBE_ALLOW, 0)
    assert h.router.on_messages(recovered(1, 2, 3)).pause == (SUBJECT,)
    h.take(1)  # resumed; the request goes out a moment later
    h.status(Status.DATA_SYNC, 3)  # the end of the answer that 2 and 3 were dropped from
    assert h.tracker.position == Position(7, 1)
    (request,) = h.router.requests_for(SESSION)
    assert request.position == Position(7, 1)
