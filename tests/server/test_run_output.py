"""A session takes a run of frames (migratory/server/run_output.py) with the outcome of
one ``deliver`` per frame: the same bytes on the wire, the same batch writes where they
matter, the same slow-consumer cut-off (ClientMaxPendingBytes, OutboxMemoryBudget) --
in fewer appends."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from migratory.config import Config
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
    return (bytes(link.wire), link.room, link.writing, session.outbox.pending_bytes,
            session.outbox.take(), session.closing, session.aborted, session.close_code,
            server.ctx.stats.slow_consumers, None if budget is None else budget.used)


@settings(max_examples=150, deadline=None)
@given(
    batch_space=st.integers(64, 3000),
    max_pending=st.integers(1024, 6000),
    budget=st.sampled_from([0, 2000, 5000, 1 << 30]),
    room=st.integers(0, 12_000),
    before=st.lists(st.integers(1, 500), max_size=8),
    run=st.lists(st.integers(1, 500), min_size=1, max_size=40),
    writing=st.booleans(),
)
def test_a_run_ends_as_its_frames_one_by_one(
    batch_space: int, max_pending: int, budget: int, room: int, before: list[int],
    run: list[int], writing: bool,
) -> None:
    settings = {"MaxBatchingSpace": str(batch_space), "ClientMaxPendingBytes": str(max_pending),
                "OutboxMemoryBudget": str(budget)}
    frames = tuple(bytes([n % 251]) * size for n, size in enumerate(run))
    outcomes = []
    for joined in (False, True):
        session, link, server = new_session(settings, room)
        link.writing = writing and room == 0  # a socket already full
        for n, size in enumerate(before):  # what was queued before
            session.deliver(bytes([200 + n]) * size)
        if joined:
            session.deliver_run(b"".join(frames), frames)
        else:
            for frame in frames:
                session.deliver(frame)
        outcomes.append(outcome(session, link, server))
    assert outcomes[0] == outcomes[1]


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
