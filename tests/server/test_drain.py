"""The drain (migratory/server/drain.py) without sockets: who is told to leave when,
which publishes are settled or refused, when it gives up."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import trio
import trio.testing

from migratory.model.message import Message
from migratory.protocol import close_codes, ops
from migratory.server.drain import DRAINING, REFUSED, Drain


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

    def submit(self, message: Message, reply: Any, now: float) -> None:
        self.held.append((message, reply))

    def settle(self) -> None:
        for message, reply in self.held:
            if reply is not None:
                reply.publish_result(
                    ops.PublishStatus(ops.Status.PUBLISH_OK, message.closure, message.subject)
                )
        self.held.clear()

    def statistics(self) -> dict[str, Any]:
        return {}


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
            connections.discard(next(c for c in connections if c.session is busy))
            connections.discard(next(c for c in connections if c.session is idle))

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
