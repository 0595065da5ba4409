"""Positions from a hostile server, through the router as a session feeds it: whatever
order of subscribe answers, DATA_SYNC / DATA_RESYNC (with any position, twice, early),
messages of any epoch, seq and type, and lost sessions, the application never gets a
message twice, out of order, or after a gap unless a DATA_RESYNC told it so."""

from __future__ import annotations

from typing import Any

import trio
from hypothesis import given, settings
from hypothesis import strategies as st

from migratory.model.message import Message, MessageType
from migratory.model.position import Position
from migratory.protocol.ops import Status, SubjectStatus
from migratory_client.events import Notification, NotificationStatus
from migratory_client.notifications import NotificationQueue
from migratory_client.resume import SubjectTracker, Verdict
from migratory_client.routing import Outlet, Router

SUBJECT = "/a/b"

steps = st.lists(
    st.one_of(
        st.tuples(st.just("message"), st.sampled_from([7, 8]), st.integers(0, 3),
                  st.sampled_from(list(MessageType))),
        st.tuples(st.just("status"),
                  st.sampled_from([Status.SUBSCRIBE_ALLOW, Status.DATA_SYNC, Status.DATA_RESYNC]),
                  st.none() | st.builds(Position, st.sampled_from([7, 8]), st.integers(0, 3))),
        st.tuples(st.just("lost")),
    ),
    max_size=25,
)


def played(script: list[tuple[Any, ...]], history: int) -> list[Message | Notification]:
    """What the application gets, in order, from the router fed ``script``."""
    notifications = NotificationQueue(1000)
    router = Router(notifications)
    send, receive = trio.open_memory_channel[Message](1000)
    router.add([SubjectTracker(SUBJECT, history=history)], Outlet(send))
    session = 1
    router.sent(session, router.requests_for(session))
    got: list[Message | Notification] = []
    for step in script:
        if step[0] == "message":
            _, epoch, seq, kind = step
            message = Message(SUBJECT, b"x", epoch=epoch, seq=seq, type=kind)
            router.sent(session, router.on_messages([message]).resubscribe)
        elif step[0] == "status":
            status = SubjectStatus(step[1], SUBJECT, step[2])
            router.sent(session, router.on_subject_status(status, "ws://s", session))
        else:
            router.session_lost("cut")
            session += 1
            router.sent(session, router.requests_for(session))
        while True:
            try:
                got.append(receive.receive_nowait())
            except trio.WouldBlock:
                break
        got += [notifications.get_nowait() for _ in range(notifications.pending)]
    return got


@settings(max_examples=1000)
@given(steps, st.sampled_from([0, 2]))
def test_no_duplicate_gap_or_disorder_without_a_resync(
    script: list[tuple[Any, ...]], history: int
) -> None:
    last: tuple[int, int] | None = None
    seen: set[tuple[int, int]] = set()
    resynced = False
    for item in played(script, history):
        if isinstance(item, Notification):
            resynced = resynced or item.status is NotificationStatus.DATA_RESYNC
            continue
        if item.type in (MessageType.SNAPSHOT, MessageType.HISTORICAL):
            continue
        at = (item.epoch, item.seq)
        if not resynced:
            assert at not in seen, f"{at} twice"
            if last is not None and last[0] == at[0]:
                assert at[1] == last[1] + 1, f"{at} after {last}"
            elif last is not None:
                assert at[1] == 1, f"{at} after {last}: a lineage entered in its middle"
        seen.add(at)
        last, resynced = at, False


def test_a_server_going_back_to_a_lineage_left_behind_repeats_nothing() -> None:
    # was: 8:1 delivered, then 7:1 (a new lineage), then 8:1 again -- also a lineage
    # "from its start" -- delivered a second time
    tracker = SubjectTracker(SUBJECT)
    tracker.on_status(Status.SUBSCRIBE_ALLOW, Position(8, 0))
    verdicts = [tracker.on_message(Message(SUBJECT, b"x", epoch=e, seq=1)) for e in (8, 7, 8)]
    assert verdicts == [Verdict.DELIVER, Verdict.DELIVER, Verdict.DUPLICATE]


def test_a_status_moving_back_to_a_lineage_left_behind_keeps_its_highest_seq() -> None:
    tracker = SubjectTracker(SUBJECT)
    tracker.on_status(Status.SUBSCRIBE_ALLOW, Position(8, 5))
    tracker.on_status(Status.DATA_RESYNC, Position(7, 3))
    tracker.on_status(Status.DATA_RESYNC, Position(8, 0))  # was: back to 8:0
    assert tracker.position == Position(8, 5)
    assert tracker.on_message(Message(SUBJECT, b"x", epoch=8, seq=1)) is Verdict.DUPLICATE
