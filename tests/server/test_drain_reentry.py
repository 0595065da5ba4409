"""Drain.run called while a drain runs (a SIGTERM during the drain of a seed leaving after
its Raft stopped, cluster/node.py), or after one was cancelled."""

from __future__ import annotations

from typing import Any

import trio
import trio.testing
from test_drain import FakeConnection, FakeSession, HeldPublishing, gone, message

from migratory.protocol import close_codes
from migratory.server.drain import Drain


def test_a_second_drain_while_one_runs_waits_for_it_and_shares_its_report() -> None:
    """A SIGTERM during the drain of a seed that leaves after its Raft stopped
    (cluster/node.py) called ``run`` again: two drains ran side by side, each telling the
    clients and reporting. Now the second waits for the first and returns its report."""
    drain = Drain(30)
    inner = HeldPublishing()
    publishing = drain.publishing(inner)
    busy, idle = FakeSession(), FakeSession()
    connections = {FakeConnection(busy), FakeConnection(idle)}
    publishing.submit(message("c1"), busy, 0.0)
    reports: list[Any] = []

    async def main() -> None:
        async with trio.open_nursery() as nursery:

            async def run() -> None:
                reports.append(await drain.run(lambda: connections))

            nursery.start_soon(run)
            await trio.sleep(1)
            nursery.start_soon(run)  # the SIGTERM's
            await trio.sleep(1)
            assert reports == []  # the second waits, as the first does
            inner.settle()
            await trio.sleep(0.1)
            for c in list(connections):
                gone(drain, connections, c)

    trio.run(main, clock=trio.testing.MockClock(autojump_threshold=0))
    first, second = reports
    assert second is first
    assert (first.clients, first.clients_told, first.publishes_settled) == (2, 2, 1)
    assert busy.order == ["status c1", "close"] and idle.order == ["close"]


def test_a_drain_after_a_cancelled_one_drains() -> None:
    """The running drain cancelled (a SIGINT cuts a SIGTERM's drain short): a drain
    waiting for it, or called later, drains on its own."""
    drain = Drain(30)
    connections = {FakeConnection(FakeSession())}
    told = list(connections)
    reports: list[Any] = []

    async def main() -> None:
        with trio.move_on_after(1):
            await drain.run(lambda: {FakeConnection(FakeSession())} | connections)
        reports.append(await drain.run(lambda: connections))

    async def leave() -> None:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(main)
            await trio.sleep(2)
            for c in list(connections):
                gone(drain, connections, c)

    trio.run(leave, clock=trio.testing.MockClock(autojump_threshold=0))
    (report,) = reports
    assert report.clients == 1 and report.clients_left == 1 and not report.timed_out
    assert all(c.session.close_code == close_codes.DRAINED.code for c in told)
