"""Rebalancing (migratory/server/rebalance.py) without sockets: how many clients move,
from which reports, and only through the drain's settle-then-close."""

from __future__ import annotations

import random
from dataclasses import dataclass, field
from typing import Any

import pytest

from migratory.model.message import Message
from migratory.protocol import close_codes
from migratory.server.drain import MOVED, Drain
from migratory.server.rebalance import (
    STALE_AFTER,
    WARM_UP,
    LoadReport,
    Rebalancer,
    clients_to_move,
    load_subject,
)


@pytest.mark.parametrize(
    ("mine", "others", "percent", "moves"),
    [
        (30, [0, 0, 0], 20, 6),  # 20 % of 30 per second
        (30, [0, 0, 0], 100, 23),  # down to the average (7.5, rounded down: others below)
        (8, [7, 7, 8], 20, 0),  # balanced within rounding
        (9, [7, 7, 7], 1, 1),  # at least one per round while above
        (7, [7, 7, 4], 20, 1),  # 7 is the rounded-up average, but a member has only 4
        (7, [7, 6, 6], 20, 0),  # 6.5: nobody below 6
        (3, [0], 100, 2),  # 3 vs 0: down to 1
        (30, [], 20, 0),  # nobody to move to
        (30, [0, 0, 0], 0, 0),  # off
    ],
)
def test_clients_to_move(mine: int, others: list[int], percent: int, moves: int) -> None:
    assert clients_to_move(mine, others, percent, 1.0) == moves


def test_load_reports_round_trip_and_anything_else_is_ignored() -> None:
    report = LoadReport(12, 3)
    assert LoadReport.decode(report.encode()) == report
    for junk in (b"", b"{", b"[]", b'{"clients": -1, "serial": 1}',
                 b'{"clients": "9", "serial": 1}', b'{"serial": 1}', b"\xff"):
        assert LoadReport.decode(junk) is None


@dataclass(eq=False)
class Session:
    is_websocket: bool = True
    connected: bool = True
    closing: bool = False
    close_code: int | None = None
    reason: str = ""

    def close(self, code: int, reason: str) -> None:
        self.closing, self.close_code, self.reason = True, code, reason


@dataclass(eq=False)
class Connection:
    session: Session

    def flush(self) -> None:
        pass


@dataclass
class World:
    snapshots: dict[str, Message] = field(default_factory=dict)
    published: list[Message] = field(default_factory=list)

    def snapshot(self, subject: str) -> Message | None:
        return self.snapshots.get(subject)

    def submit(self, message: Message, reply: Any, now: float) -> None:
        self.published.append(message)

    def statistics(self) -> dict[str, Any]:
        return {}

    def report(self, member: tuple[str, int], clients: int, serial: int) -> None:
        subject = load_subject(member)
        self.snapshots[subject] = Message(subject, LoadReport(clients, serial).encode())


ME, A, B = ("m0", 9800), ("m1", 9800), ("m2", 9800)


def rebalancer(world: World, connections: set[Connection], drain: Drain,
               ready: list[str | None]) -> Rebalancer:
    return Rebalancer(
        me=ME, members=[ME, A, B], percent=25, hub=world, publishing=world,  # type: ignore[arg-type]
        readiness=lambda: ready[0], drain=drain, connections=lambda: connections,
        rng=random.Random(1),
    )


def test_a_member_above_the_average_moves_clients_through_the_drain() -> None:
    world, drain, ready = World(), Drain(30), [None]
    connections = {Connection(Session()) for _ in range(12)}
    connections.add(Connection(Session(is_websocket=False)))  # an HTTP probe: not a client
    member = rebalancer(world, connections, drain, ready)
    world.report(A, 0, 1)
    world.report(B, 0, 1)
    assert member.step(0.0) == 0  # warming up: it may not have heard from everyone yet
    world.report(A, 0, 2)
    world.report(B, 0, 2)
    assert member.step(WARM_UP) == 3  # 25 % of 12; the average is 4
    assert LoadReport.decode(world.published[-1].content) == LoadReport(12, 2)
    assert world.published[-1].retained and world.published[-1].subject == load_subject(ME)
    moved = [c.session for c in connections if c.session.closing]
    assert len(moved) == 3
    assert all(s.close_code == close_codes.DRAINED.code and s.reason == MOVED for s in moved)
    for connection in [c for c in connections if c.session.closing]:
        connections.discard(connection)  # they left
    world.report(A, 3, 3)
    world.report(B, 0, 3)
    assert member.step(WARM_UP + 1) == 2  # 9 against 3 and 0: the average is 4, 25 % is 2


def test_no_moves_from_stale_reports_or_while_not_ready() -> None:
    world, drain, ready = World(), Drain(30), ["syncing"]
    connections = {Connection(Session()) for _ in range(12)}
    member = rebalancer(world, connections, drain, ready)
    world.report(A, 0, 1)
    member.step(0.0)
    assert member.step(WARM_UP) == 0  # not ready: reports, moves nothing
    assert len(world.published) == 2
    ready[0] = None
    assert member.step(WARM_UP + STALE_AFTER + 1) == 0  # A's report never changed: gone
    world.report(A, 0, 2)
    assert member.step(WARM_UP + STALE_AFTER + 2) == 3
