"""A history answer made in slices over the loop's turns (migratory/server/history_frame.py,
Outbox.hold): the client gets the same bytes as when the history was made whole in the
subscribe's step -- live messages published meanwhile after it, once, with no gap -- and
a step encodes at most HISTORY_SLICE of its messages. Counted, never timed."""

from __future__ import annotations

import random
from collections.abc import Iterator
from typing import Any

import pytest
from rawclient import RawClient
from test_admission import Wire

from migratory.config import Config
from migratory.entitlement import entitlement_from_config
from migratory.model.message import Message, MessageType, Qos
from migratory.model.outbox import Outbox, SlowConsumer
from migratory.model.position import Position
from migratory.protocol import ops
from migratory.protocol import websocket as ws
from migratory.protocol.http import handshake_request, new_websocket_key
from migratory.server import hub_resume
from migratory.server.app import build_hub
from migratory.server.context import LocalPublishing, ServerContext, ServerStatistics
from migratory.server.format_sink import op_frame
from migratory.server.history_frame import HISTORY_SLICE, SlicedHistory
from migratory.server.hub import Hub
from migratory.server.session import Session
from migratory.server.session_subscriptions import SLICE_UNITS

SUBJECT = "/Hist/one"
OTHER = "/Hist/other"
EPOCH = 5


def varied(n: int) -> Message:
    """Messages of every shape a batch item can take."""
    fields = {"k": str(n), "ü": "v" * (n % 7)} if n % 3 == 0 else {}
    return Message(SUBJECT, bytes([n % 256]) * (n % 300), fields, retained=n % 5 == 0,
                   qos=Qos.GUARANTEED if n % 4 == 0 else Qos.STANDARD)


class Sink:
    def deliver(self, frame: bytes) -> None:
        pass


@pytest.mark.parametrize("count", [HISTORY_SLICE + 1, 255, 256, 1000, 70_000])
def test_a_history_made_in_slices_is_the_frame_made_whole(count: int) -> None:
    """Array headers of every length CBOR has up to 32 bits, slices of odd sizes."""
    hub = Hub(epoch=EPOCH, max_cached_messages=count + 10)
    for n in range(count + 10):
        hub.publish(varied(n) if count < 70_000 else Message(SUBJECT, b"x"), 0.0)
    whole = hub.subscribe(Sink(), ops.SubscriptionRequest(SUBJECT, history=count), 0.0)
    answer, _ = hub.start_resume(Sink(), ops.SubscriptionRequest(SUBJECT, history=count),
                                 0.0, None, sliced_history=True)
    assert answer[0] == whole[0]
    sliced = answer[1]
    assert isinstance(sliced, SlicedHistory) and len(sliced.history) == count
    history = sliced.history
    steps = random.Random(count)
    while not history.made:
        history.advance(steps.choice((1, 7, HISTORY_SLICE, 1000)))
    frame = history.frame()
    assert frame == op_frame(whole[1])
    assert len(frame) <= history.bound


def new_session(**settings: str) -> tuple[Session, ServerContext]:
    config = Config.from_mapping(settings)
    hub = build_hub(config, epoch=EPOCH)
    ctx = ServerContext(
        config, hub, entitlement_from_config(config), ServerStatistics(), LocalPublishing(hub)
    )
    session = Session(ctx, Wire(), "127.0.0.1:1")
    connect = ws.encode_masked_binary(ops.encode_client_op(ops.Connect("c")), b"mask")
    session.receive_data(handshake_request("127.0.0.1", "/", new_websocket_key()) + connect,
                         0.0)
    session.outbox.take()
    return session, ctx


@pytest.fixture
def encoded(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[int]]:
    """Messages of a history encoded (``ops.message_map``), in the current step."""
    counts = [0]
    real = ops.message_map

    def counting(message: Message) -> dict[str, object]:
        counts[-1] += 1
        return real(message)

    monkeypatch.setattr(ops, "message_map", counting)
    yield counts


ROUNDS = 60  # more than the slices of any answer below
WHOLE = 10**9  # HISTORY_SLICE patched to this: the history made whole, as before


def run(
    subscribe: ops.SubscriptionRequest, encoded: list[int], *, close_at: int | None = None,
) -> bytes:
    """One client subscribing with ``subscribe`` after 3,000 publishes; its session works a
    turn's share at a time (Session.process with a budget) while it has more to do, in
    ROUNDS rounds, a message published to the subject and one to another it holds after
    each round; everything it would write."""
    session, ctx = new_session(MaxCachedMessagesPerSubject="5000", MaxPublishesPerSecond="0")
    for n in range(3000):
        ctx.hub.publish(varied(n), 0.0)
    ctx.hub.publish(Message(OTHER, b"o"), 0.0)
    first = ws.encode_masked_binary(ops.encode_client_op(ops.Subscribe((
        ops.SubscriptionRequest(OTHER),))), b"mask")
    session.receive_data(first, 0.0)
    out = [session.outbox.take()]
    encoded.clear()
    encoded.append(0)
    more = session.receive_data(ws.encode_masked_binary(ops.encode_client_op(
        ops.Subscribe((subscribe,))), b"mask"), 0.0, budget=SLICE_UNITS)
    for step in range(1, ROUNDS + 1):
        out.append(session.outbox.take())
        ctx.hub.publish(Message(SUBJECT, b"live %d" % step), 0.0)
        ctx.hub.publish(Message(OTHER, b"other %d" % step), 0.0)
        if step == close_at:
            session.close(1001, "going away")
        encoded.append(0)
        if more:
            more = session.process(0.0, budget=SLICE_UNITS)
    assert not more
    out.append(session.outbox.take())
    return b"".join(out)




@pytest.mark.parametrize("subscribe", [
    ops.SubscriptionRequest(SUBJECT, history=2500),
    ops.SubscriptionRequest(SUBJECT, history=1000, position=Position(EPOCH, 1500)),
    ops.SubscriptionRequest(SUBJECT, history=2000, position=Position(EPOCH, 2999)),
], ids=["fresh", "resume-far-back", "resume-near"])
@pytest.mark.parametrize("close_at", [None, 3], ids=["open", "closed-while-made"])
def test_the_client_gets_what_the_history_made_whole_gave_it_a_slice_per_step(
    subscribe: ops.SubscriptionRequest, close_at: int | None, encoded: list[int],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Before, the subscribe's step encoded the whole history (2,500 messages); now a
    step encodes at most HISTORY_SLICE, and the bytes written -- the history, then the
    live messages of both subjects published between the steps, or a close frame
    queued meanwhile -- are the same as when it was made whole."""
    sliced = run(subscribe, encoded, close_at=close_at)
    most = max(encoded)
    monkeypatch.setattr(hub_resume, "HISTORY_SLICE", WHOLE)
    whole = run(subscribe, encoded, close_at=close_at)
    assert max(encoded) >= subscribe.history  # (the check below can fail)
    assert sliced == whole
    if close_at is None:  # (a close makes the rest at once, in its step, as before)
        assert most <= HISTORY_SLICE, f"{most} messages encoded in one step"


def test_frames_queued_behind_a_history_being_made_wait_for_it() -> None:
    outbox = Outbox(batch_space=500, max_pending=1000)
    outbox.enqueue(b"a" * 10)
    outbox.hold(300)
    assert outbox.enqueue(b"b" * 10) is False and outbox.pending_bytes == 320
    assert outbox.take() == b"a" * 10 and not outbox  # only what came before it
    outbox.requeue_unsent(b"a" * 4)  # a short write: its rest goes back in front
    assert outbox.take() == b"a" * 4 and not outbox
    with pytest.raises(SlowConsumer):  # counted by its bound as if queued
        outbox.enqueue(b"c" * 700)
    assert outbox.fill(b"h" * 250) is False  # its own size now: 260 pending
    assert outbox.pending_bytes == 260 and outbox.take() == b"h" * 250 + b"b" * 10
    with pytest.raises(SlowConsumer):
        outbox.hold(2000)
    assert not outbox.holding and outbox.pending_bytes == 0


def test_a_dropped_outbox_drops_the_place_held() -> None:
    outbox = Outbox(batch_space=100, max_pending=1000)
    outbox.hold(300)
    outbox.enqueue(b"x")
    outbox.discard()
    assert not outbox.holding and outbox.pending_bytes == 0 and not outbox


@pytest.mark.parametrize("history", [1, 50, 100, 200])
def test_the_history_is_what_the_cache_gave_before(history: int) -> None:
    """A subscribe's history, fresh or as of a resume's position, is read from the cache
    without building the rest (a resume far back built every message it would recover
    too): the same messages as before, with the cache's front evicted."""
    hub = Hub(epoch=EPOCH, max_cached_messages=100)
    for n in range(250):
        hub.publish(varied(n), 0.0)  # seqs 151-250 cached
    cache = hub._subjects[SUBJECT].cache
    fresh = hub.subscribe(Sink(), ops.SubscriptionRequest(SUBJECT, history=history), 0.0)
    before = tuple(m.as_type(MessageType.HISTORICAL) for m in cache.last(history))
    assert fresh[1] == ops.Deliver(before)
    for seq in (150, 151, 152, 180, 249, 250):
        answer = hub.subscribe(Sink(), ops.SubscriptionRequest(
            SUBJECT, history=history, position=Position(EPOCH, seq)), 0.0)
        got = [m for op in answer if isinstance(op, ops.Deliver) for m in op.messages
               if m.type is MessageType.HISTORICAL]
        after = 250 - seq
        old = cache.last(history + after)[: -after or None][-history:] if seq >= 151 else []
        assert got == [m.as_type(MessageType.HISTORICAL) for m in old], seq


def test_over_a_socket_the_history_then_what_was_published_meanwhile(
    start_server: Any,
) -> None:
    """A real server: a client asks for a history of 2,500 messages (made in slices by its
    session's reader and writer) while a publisher goes on; it gets the history, then
    every message published after it live, once, in order."""
    server = start_server(BatchTime="0", MaxCachedMessagesPerSubject="3000",
                          MaxPublishesPerSecond="0")
    publisher = RawClient(server.port)
    publisher.connect("publisher")
    for n in range(2500):
        publisher.send_op(ops.Publish(Message(SUBJECT, b"h%d" % n, closure="c")))
    for _ in range(2500):
        assert isinstance(publisher.recv_op(), ops.PublishStatus)
    subscriber = RawClient(server.port)
    subscriber.connect("subscriber")
    subscriber.subscribe(SUBJECT, history=2500)
    for n in range(200):
        publisher.send_op(ops.Publish(Message(SUBJECT, b"l%d" % n)))
    allow = subscriber.recv_op()
    assert isinstance(allow, ops.SubjectStatus) and allow.status is ops.Status.SUBSCRIBE_ALLOW
    assert allow.position is not None
    at = allow.position.seq  # (publishes sent after the subscribe may come first)

    def content(seq: int) -> bytes:
        return b"h%d" % (seq - 1) if seq <= 2500 else b"l%d" % (seq - 2501)

    history = subscriber.recv_op()
    assert isinstance(history, ops.Deliver)
    assert [m.seq for m in history.messages] == list(range(at - 2499, at + 1))
    assert [m.content for m in history.messages] == [content(s) for s in range(at - 2499, at + 1)]
    assert {m.type for m in history.messages} == {MessageType.HISTORICAL}
    live = subscriber.recv_messages(2700 - at)
    assert [m.seq for m in live] == list(range(at + 1, 2701))
    assert [m.content for m in live] == [content(s) for s in range(at + 1, 2701)]
