"""A session takes a run of frames (migratory/server/run_output.py) with the outcome of
one ``deliver`` per frame: the same bytes on the wire, the same batch writes where they
matter, the same slow-consumer cut-off (ClientMaxPendingBytes, OutboxMemoryBudget) --
in fewer appends."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from migratory.config import Config
from migratory.model.outbox import Outbox
from migratory.protocol import close_codes
from migratory.protocol import websocket as ws
from migratory.server.app import Server
from migratory.server.session import Session


class Socket:
    """A session's link whose socket takes ``room`` bytes in all, then nothing (a drain
    task owns it from then on: ``writing``, as the connection's). Counts the appends."""

    session: Session

    def __init__(self, room: int) -> None:
        self.room = room
        self.wire = bytearray()
        self.writing = False

    def mark_dirty(self) -> None:
        pass

    def flush_now(self) -> None:
        session = self.session
        if self.writing or session.aborted or not session.outbox:
            return
        batch = session.outbox.take()
        sent = min(self.room, len(batch))
        self.room -= sent
        self.wire += batch[:sent]
        if sent < len(batch):
            session.outbox.requeue_unsent(batch[sent:])
            self.writing = True


def new_session(settings: dict[str, str], room: int) -> tuple[Session, Socket, Server]:
    server = Server(Config.from_mapping({"MaxMessageSize": "500", **settings}))
    link = Socket(room)
    link.session = session = Session(server.ctx, link, "127.0.0.1:1")
    session.receive_data(
        b"GET / HTTP/1.1\r\nHost: x\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
        b"Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n\r\n",
        0.0,
    )
    session.outbox.take()  # (the handshake's answer)
    return session, link, server


def outcome(session: Session, link: Socket, server: Server) -> tuple[object, ...]:
    budget = server.ctx.outbox_budget
    return (session.outbox.take(), bytes(link.wire), link.room, link.writing,
            session.closing, session.aborted, session.close_code,
            server.ctx.stats.slow_consumers, None if budget is None else budget.used)


@settings(max_examples=150, deadline=None)
@given(
    batch_space=st.integers(64, 3000),
    max_pending=st.integers(1024, 6000),
    budget=st.sampled_from([0, 2000, 5000, 1 << 30]),
    room=st.integers(0, 12_000),
    before=st.lists(st.integers(1, 500), max_size=8),
    runs=st.lists(st.lists(st.integers(1, 500), min_size=1, max_size=15), min_size=1,
                  max_size=5),
    writing=st.booleans(),
)
def test_runs_end_as_their_frames_one_by_one(
    batch_space: int, max_pending: int, budget: int, room: int, before: list[int],
    runs: list[list[int]], writing: bool,
) -> None:
    settings = {"MaxBatchingSpace": str(batch_space), "ClientMaxPendingBytes": str(max_pending),
                "OutboxMemoryBudget": str(budget)}
    sizes = [size for run in runs for size in run]
    frames = tuple(bytes([n % 251]) * size for n, size in enumerate(sizes))
    outcomes = [outcome_of(settings, room, writing, before, frames, runs if joined else None)
                for joined in (False, True)]
    (old_rest, *old), (new_rest, *new) = outcomes
    assert old == new  # the wire, the socket, the limits, the close, the budget
    assert new_rest == old_rest or kept_more(old_rest, new_rest, frames)


def outcome_of(settings: dict[str, str], room: int, writing: bool, before: list[int],
               frames: tuple[bytes, ...], runs: list[list[int]] | None,
               ) -> tuple[object, ...]:
    """What is left queued, then the rest of :func:`outcome`, after ``frames`` -- one by
    one, or as ``runs`` (consecutive frames joined)."""
    session, link, server = new_session(settings, room)
    link.writing = writing and room == 0  # a socket already full
    for n, size in enumerate(before):  # what was queued before
        session.deliver(bytes([200 + n]) * size)
    if runs is None:
        for frame in frames:
            session.deliver(frame)
    else:
        start = 0
        for run in runs:
            part = frames[start:start + len(run)]
            session.deliver_run(b"".join(part), part)
            start += len(run)
    rest, *others = outcome(session, link, server)
    return (rest, *others)


CLOSE = ws.encode_close(close_codes.SLOW_CONSUMER.code, "slow consumer")


def kept_more(old_rest: object, new_rest: object, frames: tuple[bytes, ...]) -> bool:
    """Cut off with a run partly written: the run's unwritten rest is kept, whole frames
    after the cut one (in order), before the close frame -- where one frame's rest was."""
    assert isinstance(old_rest, bytes) and isinstance(new_rest, bytes)
    assert old_rest.endswith(CLOSE) and new_rest.endswith(CLOSE)
    old_head, new_head = old_rest[:-len(CLOSE)], new_rest[:-len(CLOSE)]
    assert new_head.startswith(old_head)
    extra = new_head[len(old_head):]
    return any(extra == b"".join(frames[i:j]) for i in range(len(frames))
               for j in range(i + 1, len(frames) + 1))


def test_a_run_that_fits_is_one_append() -> None:
    session, link, _ = new_session({}, 1 << 20)
    frames = tuple(b"%03d" % n * 30 for n in range(100))  # 9,000 bytes
    session.deliver_run(b"".join(frames), frames)
    assert len(session.outbox) == 1 and link.wire == b""


def test_a_run_that_fills_a_batch_is_written_there_and_the_rest_joined() -> None:
    """As frame by frame: the batch is written when a frame fills it (the socket takes
    it), and the rest of the run follows in one append."""
    session, link, _ = new_session({"MaxBatchingSpace": "5000"}, 1 << 20)
    frames = tuple(b"%03d" % n * 30 for n in range(100))  # 90 bytes each
    session.deliver_run(b"".join(frames), frames)
    assert bytes(link.wire) == b"".join(frames[:56])  # 5,040 bytes: the 56th filled it
    assert len(session.outbox) == 1
    assert session.outbox.take() == b"".join(frames[56:])


def test_a_run_past_the_limit_cuts_the_client_off_as_its_frames_would() -> None:
    session, _, server = new_session({"ClientMaxPendingBytes": "4096",
                                      "MaxBatchingSpace": "65536"}, 0)
    frames = tuple(b"x" * 100 for _ in range(50))  # 5,000 bytes: past 4,096
    session.deliver_run(b"".join(frames), frames)
    assert session.closing and session.close_code == 4500
    assert server.ctx.stats.slow_consumers == 1
    assert b"x" not in session.outbox.take()  # dropped: only the close frame waits


def test_cut_off_with_a_run_partly_written_the_rest_of_the_run_is_kept() -> None:
    """The one difference: a batch of runs partly written (150 bytes into the first of
    five 100-byte frames), then a run past ClientMaxPendingBytes. Frame by frame, the
    rest of the frame cut by the write (50 bytes) goes out before the close frame; with
    runs, the rest of its run (50 bytes and three whole frames): more of what the client
    was sent, in order, nothing skipped (its position is the last message it got)."""
    settings = {"MaxBatchingSpace": "1000", "ClientMaxPendingBytes": "2000"}
    runs = [[100] * 5, [100] * 10, [100] * 10]
    frames = tuple(bytes([n]) * 100 for n in range(25))
    (old_rest, *old), (new_rest, *new) = [
        outcome_of(settings, 150, False, [], frames, r) for r in (None, runs)]
    assert old == new
    assert (old_rest, new_rest) == (frames[1][:50] + CLOSE,
                                    frames[1][:50] + b"".join(frames[2:5]) + CLOSE)


def test_the_frames_up_to_the_one_that_fills_a_batch_are_one_append(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The same run as above: its first 56 frames were 56 appends, one by one (the 56th
    filled the batch); they are one now, the batch written at the same frame, then the
    rest: 2 appends (57 before). 10,000 subscribers taking a 400-message jump of 1 kB
    messages were 690,000 appends in the step (docs/benchmarks.md)."""
    appends = []
    enqueue = Outbox.enqueue

    def counted(self: Outbox, frame: bytes) -> bool:
        appends.append(len(frame))
        return enqueue(self, frame)

    monkeypatch.setattr(Outbox, "enqueue", counted)
    session, link, _ = new_session({"MaxBatchingSpace": "5000"}, 1 << 20)
    frames = tuple(b"%03d" % n * 30 for n in range(100))
    session.deliver_run(b"".join(frames), frames)
    assert bytes(link.wire) == b"".join(frames[:56])
    assert appends == [56 * 90, 44 * 90]
