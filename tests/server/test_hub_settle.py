"""Resumes waiting for a lagging member (migratory/server/hub_settle.py): a message short
of every waiting position looks at none of them; the resumes it catches up with are
handed to their sessions, answered a slice at a time, and every client still gets each
message after its position once, in order, then DATA_SYNC -- publishes between slices
included. Counted, never timed."""

from __future__ import annotations

from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from migratory.model.message import Message, MessageType, Qos, new_message
from migratory.model.position import Position
from migratory.protocol import ops
from migratory.protocol.websocket import FrameDecoder
from migratory.server.hub import Hub, ResumeCursor

SUBJECT = "/Lag/s0"
EPOCH = 7


def numbered(seq: int) -> Message:
    return new_message(SUBJECT, str(seq).encode(), {}, False, Qos.STANDARD, None, EPOCH, seq,
                       MessageType.UPDATE)


class Client:
    """One client's stream, in order (the hub's answers and live frames). With
    ``hands_over``, a session: it takes a settled resume (``resume_settled``) and asks
    for it later, a slice at a time."""

    def __init__(self, hands_over: bool = True) -> None:
        self.items: list[Any] = []
        self.settled: list[str] = []
        self.cursor: ResumeCursor | None = None
        if hands_over:
            self.resume_settled = self.settled.append

    def deliver(self, frame: bytes) -> None:
        for event in FrameDecoder(client_frames=False).events(frame):
            self.answer([ops.decode_server_op(event.data)])  # type: ignore[union-attr]

    def answer(self, answer: list[ops.ServerOp]) -> None:
        for op in answer:
            self.items.extend(op.messages if isinstance(op, ops.Deliver) else [op])

    def step(self, hub: Hub, limit: int) -> int:
        """One slice of its settled resume, as its session does in one turn; the
        messages it recovered."""
        if self.cursor is not None:
            answer, self.cursor = hub.continue_resume(self, self.cursor, 0.0, limit)
        elif self.settled:
            answer, self.cursor, _ = hub.settle_resume(self, self.settled.pop(0), 0.0, limit)
        else:
            return 0
        self.answer(answer)
        return sum(len(op.messages) for op in answer if isinstance(op, ops.Deliver))

    @property
    def busy(self) -> bool:
        return self.cursor is not None or bool(self.settled)

    def seqs(self) -> list[int]:
        return [i.seq for i in self.items if isinstance(i, Message)]

    def statuses(self) -> list[ops.Status]:
        return [i.status for i in self.items if isinstance(i, ops.SubjectStatus)]


def lagging_hub(applied: int, cached: int = 1000) -> Hub:
    hub = Hub(epoch=EPOCH, numbered_elsewhere=True, max_cached_messages=cached)
    for seq in range(1, applied + 1):
        hub.apply(numbered(seq), 0.0)
    return hub


def waiting(hub: Hub, client: Client, seq: int) -> None:
    answer = hub.subscribe(client, ops.SubscriptionRequest(SUBJECT, position=Position(EPOCH, seq)),
                           0.0)
    assert [op.status for op in answer] == [ops.Status.SUBSCRIBE_ALLOW]  # type: ignore[union-attr]
    client.answer(answer)


class CountedHub(Hub):
    """Counts the looks at a waiting resume's position (``_ahead``)."""

    looks = 0

    def _ahead(self, state: Any, position: Position) -> bool:
        CountedHub.looks += 1
        return super()._ahead(state, position)


def test_a_message_short_of_every_waiting_position_looks_at_none_of_them() -> None:
    """1,000 resumes waiting 100 messages ahead: each of the 99 messages before their
    position looked at all 1,000 (99,000 looks: with 10,000 clients waiting, ~2 ms per
    message, a committed batch after another). Now a look only where one may settle."""
    hub = CountedHub(epoch=EPOCH, numbered_elsewhere=True)
    hub.apply(numbered(1), 0.0)
    clients = [Client() for _ in range(1000)]
    for n, client in enumerate(clients):
        waiting(hub, client, 101 + n % 3)  # three positions: 101, 102, 103
    CountedHub.looks = 0
    for seq in range(2, 101):
        hub.apply(numbered(seq), 0.0)
    assert CountedHub.looks == 0
    hub.apply(numbered(101), 0.0)  # a third of them settle: the others looked at once
    assert sum(c.busy for c in clients) == 334
    assert CountedHub.looks <= 1000
    CountedHub.looks = 0
    hub.apply(numbered(102), 0.0)
    hub.apply(numbered(103), 0.0)
    assert all(c.busy for c in clients)
    assert CountedHub.looks <= 2 * 666


def test_the_settled_resumes_are_handed_to_their_sessions_not_answered_at_once() -> None:
    """Before, the message that caught up with 500 waiting resumes answered all of them
    in its own call: 500 x 200 recovered messages encoded there. Now none is answered
    there; each session asks for its own, a slice at a time."""
    hub = lagging_hub(300)
    clients = [Client() for _ in range(500)]
    for client in clients:
        waiting(hub, client, 400)
    for seq in range(301, 601):
        hub.apply(numbered(seq), 0.0)
    assert all(c.settled == [SUBJECT] for c in clients)
    assert all(c.items == [c.items[0]] for c in clients)  # the SUBSCRIBE_ALLOW alone
    assert hub.statistics().subscriptions == 500  # still counted (settling)
    for client in clients:
        while client.busy:
            assert client.step(hub, 64) <= 64
        assert client.seqs() == list(range(401, 601))
        assert client.statuses() == [ops.Status.SUBSCRIBE_ALLOW, ops.Status.DATA_SYNC]


def test_a_sink_that_cannot_take_it_is_answered_at_once_as_before() -> None:
    hub = lagging_hub(10)
    client = Client(hands_over=False)
    waiting(hub, client, 15)
    for seq in range(11, 21):
        hub.apply(numbered(seq), 0.0)
    assert client.seqs() == list(range(16, 21))
    assert client.statuses() == [ops.Status.SUBSCRIBE_ALLOW, ops.Status.DATA_SYNC]


def test_an_unsubscribe_or_a_resubscribe_while_settling_drops_the_settled_resume() -> None:
    hub = lagging_hub(10)
    gone, again = Client(), Client()
    waiting(hub, gone, 12)
    waiting(hub, again, 12)
    for seq in (11, 12, 13):
        hub.apply(numbered(seq), 0.0)
    hub.unsubscribe(gone, SUBJECT)
    answer = hub.subscribe(again, ops.SubscriptionRequest(SUBJECT), 0.0)  # a fresh one
    again.answer(answer)
    assert gone.step(hub, 64) == 0 and again.step(hub, 64) == 0
    assert gone.items == gone.items[:1] and hub.statistics().subscriptions == 1
    hub.apply(numbered(14), 0.0)
    assert again.seqs() == [14]  # live once, from the fresh subscribe


def test_a_member_moved_back_while_settling_makes_the_resume_wait_again() -> None:
    """A cache sync moved the subject back before the session asked: it waits again,
    and is answered once the member is back at its position."""
    hub = lagging_hub(10)
    client = Client()
    waiting(hub, client, 12)
    hub.apply(numbered(11), 0.0)
    hub.apply(numbered(12), 0.0)
    assert client.settled == [SUBJECT]
    hub.reposition(SUBJECT, Position(EPOCH, 11), None, [numbered(s) for s in range(2, 12)], 0.0)
    assert client.step(hub, 64) == 0 and not client.busy
    hub.apply(numbered(12), 0.0)
    hub.apply(numbered(13), 0.0)
    while client.busy:
        client.step(hub, 64)
    assert client.seqs() == [13]
    assert client.statuses() == [ops.Status.SUBSCRIBE_ALLOW, ops.Status.DATA_SYNC]


@settings(max_examples=60, deadline=None)
@given(
    positions=st.lists(st.integers(min_value=21, max_value=260), min_size=1, max_size=12),
    catch_up=st.integers(min_value=0, max_value=300),
    plan=st.lists(st.tuples(st.integers(min_value=0, max_value=11),
                            st.integers(min_value=0, max_value=40)), max_size=60),
    limit=st.integers(min_value=1, max_value=50),
)
def test_settled_resumes_in_slices_miss_nothing_and_repeat_nothing(
    positions: list[int], catch_up: int, plan: list[tuple[int, int]], limit: int
) -> None:
    """Clients waiting at their positions, the member catching up, then, in any order,
    a client's slice or more messages applied: each client gets every message after its
    position once, in order, recovered then DATA_SYNC then live -- or never a silent
    gap. (A cache that holds them all: one overrun is a DATA_RESYNC, test_hub_resume.py.)"""
    hub = lagging_hub(20, cached=4000)
    clients = [Client() for _ in positions]
    for client, seq in zip(clients, positions, strict=True):
        waiting(hub, client, seq)
    last = 20
    for _ in range(catch_up):
        last += 1
        hub.apply(numbered(last), 0.0)
    for who, more in plan:
        if who < len(clients):
            clients[who].step(hub, limit)
        for _ in range(more):
            last += 1
            hub.apply(numbered(last), 0.0)
    last += 1
    hub.apply(numbered(last), 0.0)
    for client in clients:
        while client.busy:  # (a slice past its limit: what came since its resume began)
            assert client.step(hub, limit) <= max(limit, 1 + 60 * 40)
    hub.apply(numbered(last + 1), 0.0)  # live, for those subscribed
    for client, seq in zip(clients, positions, strict=True):
        statuses = client.statuses()
        if seq > last:  # not caught up with when the sessions asked: still waiting
            assert statuses == [ops.Status.SUBSCRIBE_ALLOW] and client.seqs() == []
            continue
        assert statuses == [ops.Status.SUBSCRIBE_ALLOW, ops.Status.DATA_SYNC], client.items
        assert client.seqs() == list(range(seq + 1, last + 2))
        sync = next(i for i, item in enumerate(client.items)
                    if isinstance(item, ops.SubjectStatus)
                    and item.status is ops.Status.DATA_SYNC)
        assert all(m.type is MessageType.RECOVERED for m in client.items[1:sync])
        assert all(m.type is MessageType.UPDATE for m in client.items[sync + 1:])
