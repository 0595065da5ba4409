"""SseStream on the real hub, no sockets: the exact bytes each stream gets, the event
encoded once and shared by every one-subject stream, ids that follow each stream's own
positions (Last-Event-ID resume, several subjects, the close event)."""

from __future__ import annotations

import json

from migratory.config import Config
from migratory.model.message import Message
from migratory.model.position import Position
from migratory.protocol import ops, sse
from migratory.server.app import build_hub
from migratory.server.hub import Hub
from migratory.server.sse_stream import SseStream

A, B = "/Stocks/NYSE/IBM", "/Stocks/NYSE/MSFT"
EPOCH = 7


class Output:
    def __init__(self, limit: int | None = None) -> None:
        self.events: list[bytes] = []
        self.closing = self.aborted = False
        self._limit = limit  # bytes before it is cut off, as ClientMaxPendingBytes does
        self._bytes = 0
        self.held: list[int] = []  # live bytes behind the backlog, at each backlog_grew
        self.outcomes: list[str] = []

    def deliver(self, frame: bytes) -> None:
        if self.closing:
            return
        self.events.append(frame)
        self._bytes += len(frame)
        if self._limit is not None and self._bytes > self._limit:
            self.closing = True

    def queue(self, frame: bytes) -> None:
        self.deliver(frame)

    def send_unbounded(self, data: bytes) -> None:
        self.events.append(data)

    def backlog_grew(self, held: int) -> None:
        self.held.append(held)

    def resumed(self, outcome: str) -> None:
        self.outcomes.append(outcome)


def new_hub() -> Hub:
    return build_hub(Config.from_mapping({}), epoch=EPOCH)


def open_stream(
    hub: Hub, subjects: list[str], positions: list[Position | None] | None = None
) -> tuple[SseStream, Output]:
    output = Output()
    stream = SseStream(output, subjects)
    positions = positions or [None] * len(subjects)
    requests: list[ops.SubscriptionRequest | str] = [
        ops.SubscriptionRequest(s, p) for s, p in zip(subjects, positions, strict=True)
    ]
    stream.start(hub, requests, 0.0)
    assert not stream.refill(1 << 30)  # the socket takes all at once
    return stream, output


def message_event(subject: str, content: str, seq: int, kind: str, event_id: str) -> bytes:
    data = {"subject": subject, "content": content, "fields": {}, "retained": False,
            "epoch": EPOCH, "seq": seq, "type": kind}
    return (b"data:" + json.dumps(data, separators=(",", ":")).encode()
            + b"\nid:" + event_id.encode() + b"\n\n")


def test_one_subject_streams_share_one_encoded_event_with_the_right_id() -> None:
    hub = new_hub()
    (one, out1), (two, out2) = open_stream(hub, [A]), open_stream(hub, [A])
    out1.events.clear()
    out2.events.clear()
    hub.publish(Message(A, b"a1"), 0.0)
    hub.publish(Message(A, b"a2"), 0.0)
    assert out1.events == [
        message_event(A, "a1", 1, "update", f"{EPOCH}:1"),
        message_event(A, "a2", 2, "update", f"{EPOCH}:2"),
    ]
    assert out2.events == out1.events
    assert all(x is y for x, y in zip(out1.events, out2.events, strict=True))  # encoded once
    assert one.positions == two.positions == [Position(EPOCH, 2)]


def test_a_stream_of_several_subjects_gets_its_own_id_after_the_shared_lines() -> None:
    hub = new_hub()
    _single, single_out = open_stream(hub, [A])
    both, both_out = open_stream(hub, [A, B])
    hub.publish(Message(B, b"b1"), 0.0)
    both_out.events.clear()
    single_out.events.clear()
    hub.publish(Message(A, b"a1"), 0.0)
    assert single_out.events == [message_event(A, "a1", 1, "update", f"{EPOCH}:1")]
    assert both_out.events == [message_event(A, "a1", 1, "update", f"{EPOCH}:1,{EPOCH}:1")]
    assert both.positions == [Position(EPOCH, 1), Position(EPOCH, 1)]
    closing = both.close_event(1001, "bye")
    assert closing.endswith(f"id:{EPOCH}:1,{EPOCH}:1\n\n".encode())


def test_a_resumed_stream_gets_the_missed_messages_then_sync_then_live_ids() -> None:
    hub = new_hub()
    for content in (b"1", b"2", b"3"):
        hub.publish(Message(A, content), 0.0)
    _live, live_out = open_stream(hub, [A])
    resumed, out = open_stream(hub, [A], [Position(EPOCH, 1)])  # Last-Event-ID 7:1
    assert out.events[0].startswith(b"event:subscribe\n")
    assert out.events[0].endswith(f"id:{EPOCH}:1\n\n".encode())
    assert out.events[1:3] == [
        message_event(A, "2", 2, "recovered", f"{EPOCH}:2"),
        message_event(A, "3", 3, "recovered", f"{EPOCH}:3"),
    ]
    assert [e.split(b"\n")[0] for e in out.events[3:]] == [b"event:sync"]
    assert out.events[-1].endswith(f"id:{EPOCH}:3\n\n".encode())
    out.events.clear()
    live_out.events.clear()
    hub.publish(Message(A, b"4"), 0.0)
    assert out.events == live_out.events == [message_event(A, "4", 4, "update", f"{EPOCH}:4")]
    assert resumed.close_event(1001, "bye").endswith(f"id:{EPOCH}:4\n\n".encode())


def test_a_resumed_stream_of_several_subjects_keeps_every_position_in_its_ids() -> None:
    hub = new_hub()
    hub.publish(Message(A, b"1"), 0.0)
    hub.publish(Message(A, b"2"), 0.0)
    hub.publish(Message(B, b"x"), 0.0)
    # Last-Event-ID 7:1,7:1: A's missed message comes before B is subscribed again, and
    # its id still says B's position (a cut there resumes B from it, not afresh)
    _stream, out = open_stream(hub, [A, B], [Position(EPOCH, 1), Position(EPOCH, 1)])
    assert [e.split(b"\n")[0][:15] for e in out.events] == [
        b"event:subscribe", b'data:{"subject"', b"event:sync", b"event:subscribe", b"event:sync",
    ]
    assert [e.rsplit(b"id:", 1)[1] for e in out.events] == [
        f"{EPOCH}:1,{EPOCH}:1\n\n".encode(), f"{EPOCH}:2,{EPOCH}:1\n\n".encode(),
        f"{EPOCH}:2,{EPOCH}:1\n\n".encode(), f"{EPOCH}:2,{EPOCH}:1\n\n".encode(),
        f"{EPOCH}:2,{EPOCH}:1\n\n".encode(),
    ]


def test_an_unreadable_id_keeps_every_subject_resyncing_until_its_resync() -> None:
    """Last-Event-ID unreadable: every subject comes as epoch 0 (resync). Until B's resync,
    the ids say 0:0 for B, so a cut there resyncs B again rather than subscribing it
    afresh (a snapshot without a resync event: a gap nobody was told of)."""
    hub = new_hub()
    hub.publish(Message(A, b"a", retained=True), 0.0)
    hub.publish(Message(B, b"b", retained=True), 0.0)
    _stream, out = open_stream(hub, [A, B], [Position(0, 0), Position(0, 0)])
    kinds = [e.split(b"\n")[0][:15] for e in out.events]
    assert kinds == [b"event:subscribe", b'data:{"subject"', b"event:resync",
                     b"event:subscribe", b'data:{"subject"', b"event:resync"]
    ids = [e.rsplit(b"id:", 1)[1] for e in out.events]
    assert ids[:3] == [b"0:0,0:0\n\n", b"0:0,0:0\n\n", f"{EPOCH}:1,0:0\n\n".encode()]
    assert ids[-1] == f"{EPOCH}:1,{EPOCH}:1\n\n".encode()
    # the id of a cut after A's resync, read back: B resyncs again
    text = ids[2].decode().strip()
    _again, out2 = open_stream(hub, [A, B], sse.parse_event_id(text, 2))
    assert [e.split(b"\n")[0][:15] for e in out2.events] == [
        b"event:subscribe", b"event:sync", b"event:subscribe", b'data:{"subject"',
        b"event:resync"]


def test_a_snapshot_does_not_move_a_stream_id() -> None:
    hub = new_hub()
    hub.publish(Message(A, b"r", retained=True), 0.0)
    stream, out = open_stream(hub, [A, B])
    kinds = [json.loads(e.split(b"\n")[0][5:]).get("type") for e in out.events
             if e.startswith(b"data:")]
    assert kinds == ["snapshot"]
    # from the SUBSCRIBE_ALLOWs: B has no message yet
    assert stream.positions == [Position(EPOCH, 1), Position(EPOCH, 0)]
    assert all(e.endswith(b"\n\n") and b"\nid:" in e for e in out.events)


def test_a_resume_is_encoded_and_subscribed_only_as_the_socket_takes_it() -> None:
    """A resume of 20 subjects x 200 missed 1 kB messages: each refill encodes about the
    room it is given, and subscribes the next subject only when the backlog before it is
    sent (a stream holds one subject's answer at a time). Answered whole, it encoded
    ~4 MB at once and, past ClientMaxPendingBytes, was cut (15 s of a stopped server
    for 5 such requests of 100 subjects x 1,000 cached 1 kB messages)."""
    hub = new_hub()
    subjects = [f"/r/s{n}" for n in range(20)]
    for subject in subjects:
        for _ in range(200):
            hub.publish(Message(subject, b"y" * 1000), 0.0)
    output = Output()
    stream = SseStream(output, subjects)
    encoded = []
    original = sse.message_lines

    def counting(message: Message) -> bytes:
        encoded.append(message)
        return original(message)

    sse_message_lines, sse.message_lines = sse.message_lines, counting
    try:
        stream.start(hub, [ops.SubscriptionRequest(s, Position(EPOCH, 1)) for s in subjects],
                     0.0)
        assert not encoded and hub.statistics().subscriptions == 0
        assert stream.refill(300_000)  # more waits
        assert 250 < len(encoded) < 300  # ~300 kB of events, not the 3,980 missed
        # the first subject subscribed, the second's resume under way (a slice of its
        # 199 messages sent; it is subscribed with its last slice)
        assert hub.statistics().subscriptions == 1
        refills = 1
        while stream.refill(300_000):
            refills += 1
            assert refills < 20
    finally:
        sse.message_lines = sse_message_lines
    assert len(encoded) == 20 * 199 and hub.statistics().subscriptions == 20
    assert output.outcomes == ["sync"] * 20 and not stream.catching_up
    assert stream.positions == [Position(EPOCH, 200)] * 20


def test_live_messages_wait_behind_the_backlog_and_count_against_the_limit() -> None:
    """Live messages that come while a resume is sent go after it (each subject's order,
    each id naming what was sent before it); only they are counted (backlog_grew)."""
    hub = new_hub()
    for n in range(50):
        hub.publish(Message(A, f"{n}".encode() + b"x" * 100), 0.0)
    output = Output()
    stream = SseStream(output, [A])
    stream.start(hub, [ops.SubscriptionRequest(A, Position(EPOCH, 1))], 0.0)
    assert stream.refill(1_000)  # the subscribe, then ~1 kB of the 49 missed
    assert set(output.held) == {0}  # the resume is not counted
    output.held.clear()
    hub.publish(Message(A, b"live51"), 0.0)
    hub.publish(Message(A, b"live52"), 0.0)
    event_bytes = len(sse.message_lines(Message(A, b"live51", epoch=EPOCH, seq=51)))
    assert output.held == [event_bytes + 24, 2 * (event_bytes + 24)]
    while stream.refill(1_000):
        pass
    blocks = [e for e in output.events if e.startswith(b"data:")]
    seqs = [json.loads(b.split(b"\n")[0][5:])["seq"] for b in blocks]
    assert seqs == list(range(2, 53))
    assert [b.rsplit(b"id:", 1)[1] for b in blocks] == [
        f"{EPOCH}:{n}\n\n".encode() for n in range(2, 53)]
    sync = next(e for e in output.events if e.startswith(b"event:sync"))
    assert output.events.index(sync) == 50  # after the 49 recovered, before the live
    hub.publish(Message(A, b"live53"), 0.0)  # caught up: straight to the output
    assert output.events[-1] == message_event(A, "live53", 53, "update", f"{EPOCH}:53")


class RefusingOutput(Output):
    """As a session's outbox: an event that would pass the limit is refused, what was
    taken stays, and the stream's close event ends the output (its last word)."""

    stream: SseStream

    def queue(self, frame: bytes) -> None:
        self.deliver(frame)

    def deliver(self, frame: bytes) -> None:
        if self.closing:
            return
        if self._limit is not None and self._bytes + len(frame) > self._limit:
            self.closing = True
            self.events.append(self.stream.close_event(4500, "slow consumer"))
            return
        self.events.append(frame)
        self._bytes += len(frame)


def test_the_close_event_of_a_cut_resume_names_the_last_event_taken() -> None:
    """The close event's id is what the browser resumes from: it must not claim the
    message that was refused (a gap of one message at every cut, seen by the chaos SSE
    subscribers with ClientMaxPendingBytes=32768), nor a status that was refused."""
    hub = new_hub()
    for n in range(40):
        hub.publish(Message(A, f"m{n}".encode() + b"x" * 200), 0.0)
    last = "7:1"
    got: list[int] = []
    for _ in range(20):  # each connection moves the browser on
        output = RefusingOutput(limit=2_000)
        stream = output.stream = SseStream(output, [A])
        stream.start(hub, [ops.SubscriptionRequest(A, Position(*map(int, last.split(":"))))],
                     0.0)
        stream.refill(1 << 30)
        stream.stop(hub)
        blocks = [e for e in output.events if b"\ndata:" in b"\n" + e]
        seqs = [json.loads(b.split(b"\n")[0][5:])["seq"] for b in blocks
                if b.startswith(b"data:")]
        got += seqs
        ids = [b.rsplit(b"\nid:", 1)[1].strip().decode() for b in blocks]
        if not output.closing:
            break
        assert output.events[-1].startswith(b"event:close\n")
        assert ids[-1] == ids[-2] == f"{EPOCH}:{seqs[-1]}"  # the close names the last taken
        last = ids[-1]
    assert got == list(range(2, 41))


def test_a_catch_up_is_stalled_after_two_calls_without_progress() -> None:
    """stalled(pending), called every heartbeat interval: a refill that sent something,
    or fewer bytes pending (the socket took some), is progress; two calls in a row
    without either mean a reader that stopped. A stream caught up is never stalled."""
    hub = new_hub()
    for n in range(50):
        hub.publish(Message(A, f"{n}".encode() + b"x" * 100), 0.0)
    output = Output()
    stream = SseStream(output, [A])
    stream.start(hub, [ops.SubscriptionRequest(A, Position(EPOCH, 1))], 0.0)
    assert stream.refill(500)
    assert not stream.stalled(500)  # the refill
    assert not stream.stalled(400)  # the socket took 100 bytes
    assert not stream.stalled(400)  # one interval without progress
    assert stream.stalled(400)  # two
    assert stream.refill(500)
    assert not stream.stalled(900)
    while stream.refill(1 << 20):
        pass
    assert not stream.stalled(900) and not stream.stalled(900) and not stream.stalled(900)


def test_a_catch_up_waiting_for_its_turn_with_nothing_pending_is_not_stalled() -> None:
    """The socket took all the stream was given, and its next refill waits for its turn
    of the loop (loop_turns.py) behind a herd of streams catching up: however many
    heartbeat intervals pass, the reader did not stop -- the server owes the refill. (Cut
    as stalled, 516 of 2,000 streams resuming at once were closed 4500: the benchmark
    of docs/benchmarks.md, "A herd of resumes from different positions".)"""
    hub = new_hub()
    for n in range(50):
        hub.publish(Message(A, f"{n}".encode() + b"x" * 100), 0.0)
    stream = SseStream(Output(), [A])
    stream.start(hub, [ops.SubscriptionRequest(A, Position(EPOCH, 1))], 0.0)
    assert stream.refill(500)
    assert not any(stream.stalled(0) for _ in range(5))
    assert stream.catching_up


def test_a_resume_a_lagging_member_settles_is_sent_as_the_socket_drains() -> None:
    """A stream resuming ahead of this member waits; once the member catches up, the
    hub hands the resume over (hub_settle.py): nothing is encoded by the message that
    caught up (before, every waiting stream's answer was, at once), the refills send it,
    then what came meanwhile, each once, in order, and one ``sync``."""
    hub = new_hub()
    hub.numbered_elsewhere = True
    for n in range(1, 11):
        hub.apply(Message(A, b"m", epoch=EPOCH, seq=n), 0.0)
    output = Output()
    stream = SseStream(output, [A])
    stream.start(hub, [ops.SubscriptionRequest(A, Position(EPOCH, 15))], 0.0)
    while stream.refill(1 << 20):
        pass
    assert not [e for e in output.events if e.startswith(b"data:")]  # waiting
    for n in range(11, 31):
        hub.apply(Message(A, b"m", epoch=EPOCH, seq=n), 0.0)
    assert stream.catching_up and not [e for e in output.events if e.startswith(b"data:")]
    assert stream.refill(300)  # a part of it: more waits
    for n in range(31, 41):
        hub.apply(Message(A, b"m", epoch=EPOCH, seq=n), 0.0)
    while stream.refill(1 << 20):
        pass
    hub.apply(Message(A, b"m", epoch=EPOCH, seq=41), 0.0)
    blocks = [e for e in output.events if e.startswith(b"data:")]
    assert [json.loads(b.split(b"\n")[0][5:])["seq"] for b in blocks] == list(range(16, 42))
    assert len([e for e in output.events if e.startswith(b"event:sync")]) == 1
    assert output.outcomes == ["sync"]
