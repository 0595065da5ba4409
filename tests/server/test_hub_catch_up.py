"""A cache sync moving a subject past its live subscribers (Hub.reposition ->
Hub._catch_up_live): every native subscriber and SSE stream gets the messages it jumped
over -- the same bytes, in the same order, as one delivery per message gave them
(compared with that path, ``per_message``, on the same input) -- each message encoded
once, and a native session or a one-subject stream queues them in a few appends (runs,
format_sink.MissedRun), not one per message per subscriber: 10,000 subscribers and a
jump of 400 were 4,000,000 appends in one step of the loop (docs/benchmarks.md).
Counted, never timed."""

from __future__ import annotations

import math
from collections.abc import Iterator
from contextlib import contextmanager

import pytest
from test_run_output import new_session

from migratory.config import Config
from migratory.model.conflation import Conflator, offer_run_to, offer_to
from migratory.model.message import Message, MessageType, Qos, new_message
from migratory.model.position import Position
from migratory.protocol import ops
from migratory.server import format_sink
from migratory.server import hub as hub_module
from migratory.server.app import build_hub
from migratory.server.format_sink import RUN_BYTES, AnySink, MissedRun, send_message
from migratory.server.hub import Hub
from migratory.server.sse_stream import SseStream

SUBJECT = "/Lag/live"
OTHER = "/Lag/other"
EPOCH = 9
HELD = 20  # what the member holds when the sync comes
JUMP = 400  # the sync takes it this much further


def numbered(seq: int, subject: str = SUBJECT, size: int = 100) -> Message:
    return new_message(subject, b"%d" % seq + b"x" * size, {"n": str(seq)}, False,
                       Qos.STANDARD, None, EPOCH, seq, MessageType.UPDATE)


def member(**settings: str) -> Hub:
    hub = build_hub(Config.from_mapping(settings), epoch=EPOCH)
    hub.numbered_elsewhere = True
    for seq in range(1, HELD + 1):
        hub.apply(numbered(seq), 0.0)
    hub.apply(numbered(1, OTHER), 0.0)
    return hub


def sync(hub: Hub, to: int = HELD + JUMP, size: int = 100) -> None:
    hub.reposition(SUBJECT, Position(EPOCH, to), None,
                   [numbered(seq, size=size) for seq in range(1, to + 1)], 0.0)


def per_message(sink: AnySink, missed: MissedRun) -> None:
    """What the hub did before runs: each message to each subscriber, one at a time."""
    for message, frames in zip(missed.messages, missed.frames, strict=True):
        send_message(sink, message, frames)


class Session:
    """A native session as the hub sees it: frames and runs, each one append."""

    def __init__(self) -> None:
        self.wire = bytearray()
        self.appends = 0

    def deliver(self, frame: bytes) -> None:
        self.wire += frame
        self.appends += 1

    def deliver_run(self, run: bytes, frames: tuple[bytes, ...]) -> None:
        assert run == b"".join(frames)
        self.deliver(run)


class Output(Session):
    """An SSE stream's output (the session), its socket taking all at once."""

    closing = aborted = False

    def queue(self, frame: bytes) -> None:
        self.deliver(frame)

    def send_unbounded(self, data: bytes) -> None:
        self.deliver(data)

    def backlog_grew(self, held: int) -> None:
        pass

    def resumed(self, outcome: str) -> None:
        pass


@contextmanager
def counted_encodes(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[int]]:
    encodes = [0]
    encode = format_sink.message_frame

    def counting(message: Message) -> bytes:
        encodes[0] += 1
        return encode(message)

    monkeypatch.setattr(format_sink, "message_frame", counting)
    yield encodes
    monkeypatch.setattr(format_sink, "message_frame", encode)


def test_live_sessions_get_the_jump_in_a_few_appends_each_message_encoded_once(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    hub = member()
    sessions = [Session() for _ in range(50)]
    for session in sessions:
        hub.subscribe(session, ops.SubscriptionRequest(SUBJECT), 0.0)
        session.wire.clear()
        session.appends = 0
    with counted_encodes(monkeypatch) as encodes:
        sync(hub)
    expected = b"".join(format_sink.message_frame(numbered(seq))
                        for seq in range(HELD + 1, HELD + JUMP + 1))
    runs = math.ceil(len(expected) / (RUN_BYTES - 200))  # (a run ends at a whole frame)
    for session in sessions:
        assert session.wire == expected
        # before: 400 appends each (one per message)
        assert session.appends <= runs, session.appends
    assert encodes == [JUMP]  # once, for all 50
    assert hub.statistics().frames_fanned_out == 50 * JUMP  # counted as before


@pytest.mark.parametrize("size", [100, 30_000])
def test_what_every_kind_of_subscriber_gets_is_what_one_message_at_a_time_gave(
    monkeypatch: pytest.MonkeyPatch, size: int,
) -> None:
    """Native sessions, one-subject and two-subject SSE streams (the latter's events
    wait in its backlog: written as the socket drains), and a sink that takes no runs:
    byte for byte what the per-message path gives, then the live messages after."""
    received = []
    for path in (per_message, format_sink.send_missed):
        monkeypatch.setattr(hub_module, "send_missed", path)
        hub = member()
        native, plain = Session(), Session()
        plain.deliver_run = None  # type: ignore[assignment,method-assign]
        outputs = [Output(), Output()]
        streams = [SseStream(outputs[0], [SUBJECT]), SseStream(outputs[1], [OTHER, SUBJECT])]
        hub.subscribe(native, ops.SubscriptionRequest(SUBJECT), 0.0)
        hub.subscribe(plain, ops.SubscriptionRequest(SUBJECT), 0.0)
        for stream in streams:
            stream.start(hub, [ops.SubscriptionRequest(s) for s in stream.subjects], 0.0)
            assert not stream.refill(1 << 30)
        sync(hub, size=size)
        hub.apply(numbered(HELD + JUMP + 1, size=size), 0.0)  # live, after
        for stream in streams:
            while stream.refill(1 << 16):
                pass
        received.append([bytes(sink.wire) for sink in (native, plain, *outputs)])
    assert received[0] == received[1]
    assert all(b"%d" % (HELD + JUMP + 1) in wire for wire in received[1])


def test_a_two_subject_stream_takes_the_jump_through_its_backlog() -> None:
    """Its events carry its own id: encoded as the socket drains (refill, in the
    writer's turns of the loop), not in the hub's step."""
    hub = member()
    output = Output()
    stream = SseStream(output, [OTHER, SUBJECT])
    stream.start(hub, [ops.SubscriptionRequest(OTHER), ops.SubscriptionRequest(SUBJECT)], 0.0)
    assert not stream.refill(1 << 30)
    appends = output.appends
    sync(hub)
    assert output.appends == appends and stream.catching_up
    while stream.refill(1 << 14):
        pass
    assert output.appends == appends + JUMP
    assert stream.positions == [Position(EPOCH, 1), Position(EPOCH, HELD + JUMP)]


@pytest.mark.parametrize("path", [per_message, format_sink.send_missed])
def test_a_slow_subscriber_among_them_is_cut_off_alone(
    monkeypatch: pytest.MonkeyPatch, path: object,
) -> None:
    """Real sessions: one whose socket takes nothing, its limit nearly reached, is cut
    off as a slow consumer by the run that passes it, as by the frame that would have
    (``per_message``: the same outcome); the others, whose sockets take every batch as
    it fills, get every byte."""
    monkeypatch.setattr(hub_module, "send_missed", path)
    hub = member()
    settings = {"ClientMaxPendingBytes": "131072", "MaxBatchingSpace": "16384"}
    keeping_up = [new_session(settings, 1 << 30) for _ in range(3)]
    slow, slow_link, slow_server = new_session(settings, 0)  # its socket takes nothing
    for session, _, _ in (*keeping_up, (slow, slow_link, slow_server)):
        hub.subscribe(session, ops.SubscriptionRequest(SUBJECT), 0.0)
        session.outbox.take()
    slow_link.writing = True  # (a drain task waits for the socket)
    slow.deliver(b"q" * 100_000)  # what it has not taken yet
    sync(hub)  # ~67 kB each
    assert slow.closing and slow.close_code == 4500
    assert slow_server.ctx.stats.slow_consumers == 1
    assert b"q" not in slow.outbox.take()  # dropped, the close frame queued
    expected = b"".join(format_sink.message_frame(numbered(seq))
                        for seq in range(HELD + 1, HELD + JUMP + 1))
    for session, link, server in keeping_up:
        assert len(link.wire) >= 3 * 16384  # written as batches filled, during the sync
        link.flush_now()
        assert bytes(link.wire) == expected
        assert not session.closing and server.ctx.stats.slow_consumers == 0


def offered_one_at_a_time(conflators: object, missed: list[Message], now: float) -> None:
    """What the hub did before: each message offered to every conflator in turn."""
    for message in missed:
        offer_to(conflators, message, now)  # type: ignore[arg-type]


def test_conflated_subscriptions_take_the_jump_once_folded_and_emit_the_same(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """50 conflated subscriptions (half with a message of their period pending when the
    sync comes): the jump is offered once to each, folded (conflation.offer_run_to) --
    20,000 offers before, one per message per subscription -- and what each sends at
    its next periods is byte for byte what one message at a time made it send."""
    offers = []
    real = Conflator.offered

    def counted(self: Conflator, now: float | None = None) -> None:
        offers.append(self)
        real(self, now)

    monkeypatch.setattr(Conflator, "offered", counted)
    received, counts = [], []
    for path in (offered_one_at_a_time, offer_run_to):
        monkeypatch.setattr(hub_module, "offer_run_to", path)
        hub = member()
        sessions = [Session() for _ in range(50)]
        for i, session in enumerate(sessions):
            hub.subscribe(session, ops.SubscriptionRequest(
                SUBJECT, conflation_ms=500 if i % 2 else 1000), 0.0)
        hub.apply(numbered(HELD + 1), 0.1)  # pending in every period when the sync comes
        hub.tick(0.5)  # the 500 ms ones send it, the others keep it pending
        hub.apply(new_message(SUBJECT, b"m", {"extra": "1", "n": "x"}, False, Qos.STANDARD,
                              None, EPOCH, HELD + 2, MessageType.UPDATE), 0.6)
        offers.clear()
        hub.reposition(SUBJECT, Position(EPOCH, HELD + JUMP), None,
                       [numbered(seq) for seq in range(1, HELD + JUMP + 1)], 0.7)
        counts.append(len(offers))
        for now in (1.0, 1.5, 2.0):
            hub.tick(now)
        hub.apply(numbered(HELD + JUMP + 1), 2.1)
        hub.tick(2.5)
        hub.tick(3.0)
        received.append([bytes(session.wire) for session in sessions])
    assert received[0] == received[1]
    assert all(b"%d" % (HELD + JUMP) in wire for wire in received[1])
    assert counts == [50 * (JUMP - 2), 50]
