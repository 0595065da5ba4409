"""The drain (migratory/server/drain.py) without sockets: who is told to leave when,
which publishes are settled or refused, when it gives up."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import trio
import trio.testing

from migratory.config import Config
from migratory.entitlement import entitlement_from_config
from migratory.model.message import Message
from migratory.protocol import close_codes, ops
from migratory.protocol import websocket as ws
from migratory.protocol.http import (
    check_handshake_response,
    handshake_request,
    new_websocket_key,
)
from migratory.server.app import build_hub
from migratory.server.context import ServerContext, ServerStatistics
from migratory.server.drain import DRAINING, REFUSED, Drain
from migratory.server.metric_figures import PublishTimings
from migratory.server.session import Session


@dataclass(eq=False)
class FakeSession:
    is_websocket: bool = True
    closing: bool = False
    close_code: int | None = None
    results: list[ops.PublishStatus] = field(default_factory=list)
    order: list[str] = field(default_factory=list)

    def close(self, code: int, reason: str) -> None:
        self.closing, self.close_code = True, code
        self.order.append("close")

    def publish_result(self, status: ops.PublishStatus) -> None:
        self.results.append(status)
        self.order.append(f"status {status.closure}")

    def flush(self) -> None:
        pass


@dataclass(eq=False)
class FakeConnection:
    session: FakeSession

    def flush(self) -> None:
        pass


class HeldPublishing:
    """A publish path whose outcomes the test decides (as Raft would, later)."""

    def __init__(self) -> None:
        self.held: list[tuple[Message, Any]] = []
        self.submitted: list[str | None] = []
        self.timings = PublishTimings()

    def submit(self, message: Message, reply: Any, now: float) -> None:
        self.held.append((message, reply))
        self.submitted.append(message.closure)

    def settle(self) -> None:
        for message, reply in self.held:
            if reply is not None:
                reply.publish_result(
                    ops.PublishStatus(ops.Status.PUBLISH_OK, message.closure, message.subject)
                )
        self.held.clear()

    def statistics(self) -> dict[str, Any]:
        return {}


def gone(drain: Drain, connections: Any, connection: Any) -> None:
    """``connection`` ends, as the server forgets it (app.py: Server.forget)."""
    connections.discard(connection)
    drain.left(connection)


def message(closure: str | None) -> Message:
    return Message(subject="/a/b", content=b"x", closure=closure)


def test_readiness_says_draining_once_the_drain_starts() -> None:
    drain = Drain(5)
    reason = drain.readiness(lambda: None)
    assert reason() is None
    drain.draining = True
    assert reason() == DRAINING


def test_a_client_leaves_only_after_its_publishes_have_their_status() -> None:
    drain = Drain(30)
    inner = HeldPublishing()
    publishing = drain.publishing(inner)
    busy, idle, http = FakeSession(), FakeSession(), FakeSession(is_websocket=False)
    connections = {FakeConnection(busy), FakeConnection(idle), FakeConnection(http)}
    publishing.submit(message("c1"), busy, 0.0)
    publishing.submit(message(None), None, 0.0)  # no closure: no reply, nothing to settle
    reports = []

    async def main() -> None:
        async with trio.open_nursery() as nursery:

            async def run() -> None:
                reports.append(await drain.run(lambda: connections))

            nursery.start_soon(run)
            await trio.sleep(1)
            assert idle.close_code == close_codes.DRAINED.code
            assert not busy.closing  # c1 has no status yet
            publishing.submit(message("c2"), busy, 0.0)  # after the drain began: refused
            assert busy.results[-1].status is ops.Status.PUBLISH_FAILED
            assert busy.results[-1].reason == REFUSED
            inner.settle()
            await trio.sleep(0.1)
            assert busy.close_code == close_codes.DRAINED.code
            assert busy.order == ["status c2", "status c1", "close"]
            gone(drain, connections, next(c for c in connections if c.session is busy))
            gone(drain, connections, next(c for c in connections if c.session is idle))

    trio.run(main, clock=trio.testing.MockClock(autojump_threshold=0))
    (report,) = reports
    assert not report.timed_out and report.clients_remaining == 0
    assert (report.clients_told, report.publishes_settled, report.publishes_refused) == (2, 1, 1)
    assert http.close_code is None  # a probe's HTTP request is no client to move


def test_the_drain_gives_up_after_drain_time() -> None:
    drain = Drain(7)
    stuck = FakeConnection(FakeSession())
    drain.publishing(HeldPublishing()).submit(message("never"), stuck.session, 0.0)

    async def main() -> None:
        started = trio.current_time()
        report = await drain.run(lambda: {stuck})
        assert trio.current_time() - started == 7
        assert report.timed_out and report.clients_remaining == 1 and report.clients_told == 0

    trio.run(main, clock=trio.testing.MockClock(autojump_threshold=0))


class AtOncePublishing:
    """A path that settles each publish before submit returns (LocalPublishing's way)."""

    settles_at_once = True

    def __init__(self) -> None:
        self.submitted: list[str | None] = []
        self.timings = PublishTimings()

    def submit(self, message: Message, reply: Any, now: float) -> None:
        self.submitted.append(message.closure)
        if reply is not None:
            reply.publish_result(
                ops.PublishStatus(ops.Status.PUBLISH_OK, message.closure, message.subject)
            )

    def statistics(self) -> dict[str, Any]:
        return {}


def test_an_at_once_path_is_called_directly_until_a_move_or_the_drain_starts() -> None:
    drain, inner = Drain(30), AtOncePublishing()
    publishing = drain.publishing(inner)
    assert publishing.submit == inner.submit  # nothing to check: no wrapper per publish
    moved, stays = FakeSession(), FakeSession()
    drain.move([FakeConnection(moved)])  # c1 has nothing in flight: closed at once
    assert moved.close_code == close_codes.DRAINED.code
    assert publishing.submit == inner.submit
    held, waits = FakeSession(), HeldPublishing()
    drain.publishing(waits).submit(message("c1"), held, 0.0)  # in flight: its move waits
    drain.move([FakeConnection(held)])
    assert held.close_code is None and drain.moving
    assert publishing.submit != inner.submit
    publishing.submit(message("c2"), held, 0.0)
    publishing.submit(message("c3"), stays, 0.0)
    assert [(r.closure, r.status) for r in held.results] == [("c2", ops.Status.PUBLISH_FAILED)]
    assert held.results[0].reason == REFUSED
    assert [r.status for r in stays.results] == [ops.Status.PUBLISH_OK]
    waits.settle()
    drain.close_settled()  # held has nothing in flight: closed, the path steps aside again
    assert held.close_code == close_codes.DRAINED.code and not drain.moving
    assert publishing.submit == inner.submit
    drain.draining = True
    publishing.submit(message("c4"), stays, 0.0)
    assert stays.results[-1].status is ops.Status.PUBLISH_FAILED
    assert inner.submitted == ["c3"]
    late = drain.publishing(AtOncePublishing())  # made while draining: checks from the start
    late.submit(message("c5"), stays, 0.0)
    assert stays.results[-1].reason == REFUSED and drain.refused == 3


# --- the promise on the wire, with a real session ------------------------------------


class Wire:
    """A session's link that writes nothing: the test reads the session's outbox."""

    writing = False

    def mark_dirty(self) -> None:
        pass

    def flush_now(self) -> None:
        pass


@dataclass(eq=False)
class WireConnection:
    session: Session

    def flush(self) -> None:
        pass


def client_frames(*publishes: str) -> bytes:
    return b"".join(
        ws.encode_masked_binary(ops.encode_client_op(ops.Publish(message(c))), b"mask")
        for c in publishes
    )


def test_a_drained_client_gets_every_status_of_what_was_taken_before_the_4502_close() -> None:
    # What the SDK relies on at a 4502 close (chaos run m30): in the bytes the client
    # gets, the status of every publish the member read comes before the close frame,
    # and nothing the member reads after deciding to close is taken.
    config = Config.defaults()
    drain, held = Drain(30), HeldPublishing()
    ctx = ServerContext(
        config, build_hub(config), entitlement_from_config(config), ServerStatistics(),
        drain.publishing(held),
    )
    session = Session(ctx, Wire(), "127.0.0.1:1")
    key = new_websocket_key()
    connect = ws.encode_masked_binary(ops.encode_client_op(ops.Connect("p1")), b"mask")
    session.receive_data(handshake_request("127.0.0.1", "/", key) + connect, 0.0)
    session.receive_data(client_frames("c1", "c2"), 0.0)  # taken before the drain
    connections = {WireConnection(session)}

    async def main() -> None:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(drain.run, lambda: connections)
            await trio.sleep(1)
            assert not session.closing  # c1, c2 wait for their commit
            session.receive_data(client_frames("c3"), 1.0)  # refused: draining
            held.settle()
            await trio.sleep(0.1)
            assert session.close_code == close_codes.DRAINED.code
            session.receive_data(client_frames("c4"), 1.1)  # after the close: never read
            gone(drain, connections, next(iter(connections)))

    trio.run(main, clock=trio.testing.MockClock(autojump_threshold=0))
    assert held.submitted == ["c1", "c2"]
    written = session.outbox.take()
    used = check_handshake_response(written, key)
    assert used is not None
    events = ws.FrameDecoder(client_frames=False).events(written[used:])
    assert isinstance(events[-1], ws.CloseReceived)
    assert events[-1].code == close_codes.DRAINED.code
    frames = [e.data for e in events[:-1] if isinstance(e, ws.BinaryMessage)]
    assert len(frames) == len(events) - 1
    statuses = [ops.decode_server_op(data) for data in frames]
    assert [(s.closure, s.status) for s in statuses if isinstance(s, ops.PublishStatus)] == [
        ("c3", ops.Status.PUBLISH_FAILED),
        ("c1", ops.Status.PUBLISH_OK),
        ("c2", ops.Status.PUBLISH_OK),
    ]


def test_the_drain_waits_for_the_answer_of_an_http_publish() -> None:
    """An HTTP POST /publish taken before the drain (its connection is no client to
    tell, is_websocket False) still gets its answer before the drain ends and the
    server stops: 'nothing acknowledged is lost' includes not leaving a publisher
    without its outcome."""
    drain = Drain(30)
    inner = HeldPublishing()
    publishing = drain.publishing(inner)
    http = FakeSession(is_websocket=False)
    publishing.submit(message("http"), http, 0.0)
    reports = []

    async def main() -> None:
        async with trio.open_nursery() as nursery:

            async def run() -> None:
                reports.append(await drain.run(lambda: {FakeConnection(http)}))

            nursery.start_soon(run)
            await trio.sleep(1)
            assert not reports  # still waiting for the publish's outcome
            inner.settle()
            await trio.sleep(0.1)
            assert reports

    trio.run(main, clock=trio.testing.MockClock(autojump_threshold=0))
    (report,) = reports
    assert not report.timed_out and report.publishes_settled == 1
    assert [r.status for r in http.results] == [ops.Status.PUBLISH_OK]


def test_clients_arriving_during_the_drain_do_not_hold_it_up() -> None:
    """Every member told to stop at once (a whole restart): the clients each one sends
    away try the others, which are draining too, so a member keeps getting newcomers
    it must close. Chaos whole-restart (seed 33, 2026-11-28): the last member up drained
    for 10.5 s, 52 newcomers told, where the others took 0.6-0.9 s. The drain ends once
    the clients it began with have left and nothing waits for a status: a newcomer's
    connect is refused (the readiness says draining: 1013); it is not waited for."""
    drain = Drain(30)
    first = FakeConnection(FakeSession())
    connections = {first}
    reports = []

    async def newcomers() -> None:  # one every 0.1 s, each gone 0.25 s after it is told
        async def one() -> None:
            c = FakeConnection(FakeSession())
            connections.add(c)
            while not c.session.closing:
                await trio.sleep(0.01)
            await trio.sleep(0.25)
            gone(drain, connections, c)

        async with trio.open_nursery() as nursery:
            while True:
                nursery.start_soon(one)
                await trio.sleep(0.1)

    async def main() -> None:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(newcomers)
            await trio.sleep(0.05)

            async def leave() -> None:  # the client it began with goes as it is told
                while not first.session.closing:
                    await trio.sleep(0.01)
                await trio.sleep(0.3)
                gone(drain, connections, first)

            nursery.start_soon(leave)
            reports.append(await drain.run(lambda: list(connections)))
            nursery.cancel_scope.cancel()

    trio.run(main, clock=trio.testing.MockClock(autojump_threshold=0))
    (report,) = reports
    # before: timed out after DrainTime (30 s, mock time), newcomers always there
    assert not report.timed_out and report.seconds < 1.0, report
    assert report.clients_left == 2  # the first one and the newcomer already there


# --- what the drain costs and says with many clients ----------------------------------


class CountedSession(FakeSession):
    """A FakeSession counting how often the drain looks at it."""

    looks = 0

    def __getattribute__(self, name: str) -> Any:
        if name in ("closing", "is_websocket"):
            CountedSession.looks += 1
        return super().__getattribute__(name)


def test_the_drain_works_per_change_not_per_client_per_tick() -> None:
    """1,000 clients, each leaving 0.5 s after it is told, one publish settled after 2 s:
    the drain looks at each client a few times in all. Before: every client every 20 ms
    until the last had left (2.02 s here): 101 looks per client, 101,000 in all."""
    clients = 1_000
    drain, held = Drain(30), HeldPublishing()
    connections = {FakeConnection(CountedSession()) for _ in range(clients)}
    late = next(iter(connections))
    drain.publishing(held).submit(message("c1"), late.session, 0.0)
    CountedSession.looks = 0
    reports = []

    async def main() -> None:
        async def leave(c: FakeConnection) -> None:
            while c.session.close_code is None:
                await trio.sleep(0.5)
            await trio.sleep(0.5)
            gone(drain, connections, c)

        async with trio.open_nursery() as nursery:
            for c in list(connections):
                nursery.start_soon(leave, c)
            await trio.sleep(0)
            CountedSession.looks = 0  # (the test's own looks at the start)

            async def settle() -> None:
                await trio.sleep(2)
                held.settle()

            nursery.start_soon(settle)
            reports.append(await drain.run(lambda: list(connections)))

    trio.run(main, clock=trio.testing.MockClock(autojump_threshold=0))
    (report,) = reports
    assert not report.timed_out and report.clients_told == clients
    assert report.clients_left == clients and report.clients_cut == 0
    assert CountedSession.looks <= 5 * clients, CountedSession.looks


def test_a_drain_says_two_lines_however_many_clients(caplog: Any) -> None:
    """200 connected sessions: 198 told and gone, one gone on its own while its publish
    waited, one still there at DrainTime. Before: a 'closing with 4502' line per client
    (10,000 clients: 10,000 lines) and a summary without who left how."""
    import logging

    caplog.set_level(logging.INFO, "migratory")
    config = Config.defaults()
    drain, held = Drain(5), HeldPublishing()
    ctx = ServerContext(
        config, build_hub(config), entitlement_from_config(config), ServerStatistics(),
        drain.publishing(held),
    )
    connections = set()
    for n in range(200):
        session = Session(ctx, Wire(), f"127.0.0.1:{n + 1}")
        connect = ws.encode_masked_binary(ops.encode_client_op(ops.Connect(f"c{n}")), b"mask")
        session.receive_data(handshake_request("127.0.0.1", "/", new_websocket_key())
                             + connect, 0.0)
        connections.add(WireConnection(session))
    waiting = sorted(connections, key=lambda c: c.session.connection_id)[:2]
    for n, c in enumerate(waiting):
        c.session.receive_data(client_frames(f"p{n}"), 0.0)  # never settled
    caplog.clear()

    async def main() -> None:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(drain.run, lambda: connections)
            await trio.sleep(1)
            for c in list(connections):
                if c.session.closing or c is waiting[0]:
                    gone(drain, connections, c)

    trio.run(main, clock=trio.testing.MockClock(autojump_threshold=0))
    lines = [r.getMessage() for r in caplog.records if r.levelno >= logging.INFO]
    assert len(lines) == 2, lines[:4]
    assert lines[0] == "draining 200 clients (DrainTime 5 s)"
    assert ("of the 200 clients at the start 198 left as told, 1 on their own, 1 cut at "
            "DrainTime (DrainTime reached)") in lines[1], lines[1]
    stuck = waiting[1].session  # which client held the drain, and where it was
    assert lines[1].endswith(f"; held by 1 websocket: {stuck.describe()} (not told: its "
                             "publishes wait for their status)"), lines[1]
    assert ctx.stats.closes == {"DRAINED": 198}

