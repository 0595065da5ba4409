"""Rebalancing after scale-out (``ClusterRebalanceRate``, off by default).

A member that joins a running cluster starts with no clients: clients stay where
they are, because nothing moves them. With ``ClusterRebalanceRate = P`` every
member publishes its client count once a second, retained, on its own subject
``/$migratory/load/<cluster address>`` — through the cluster's ordinary publish
path, so every member's hub holds every member's latest count — and, after a
:data:`WARM_UP` in which it only listens, a member above the average of the members
it heard from in the last :data:`STALE_AFTER` seconds moves at most ``P`` % of its
clients per second (at least one), never below the average. A moved client picks
its next member itself (the SDK's weighted choice, or the Service behind one URL),
so it may land on another busy member, which moves it on later: the cluster
converges over a few rounds, not in one. A moved client is closed as the drain
closes it (its publishes settled first, then 4502 DRAINED, a reconnect code): the
SDK reconnects to another member and resumes every subject from its position
(``DATA_SYNC``).

No client may publish on ``/$migratory/load/...`` (``/$`` subjects are the server's:
publish_rules.py); a report that does not decode is ignored, and the move rate stays
bounded either way.
"""

from __future__ import annotations

import json
import logging
import math
import random
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import trio

from migratory.model.message import Message
from migratory.server.context import PublishPath
from migratory.server.drain import Drain, DrainConnection
from migratory.server.hub import Hub

if TYPE_CHECKING:
    from migratory.server.app import Server

log = logging.getLogger("migratory.rebalance")

LOAD_PREFIX = "/$migratory/load/"
PERIOD = 1.0
"""Seconds between two reports (and two rounds of moves)."""
STALE_AFTER = 5.0
"""A member whose report has not changed for this long is left out of the average."""
WARM_UP = STALE_AFTER
"""Seconds a member only reports, after it starts, so that it has heard from every
live member before it moves anyone."""


def load_subject(address: tuple[str, int]) -> str:
    return f"{LOAD_PREFIX}{address[0]}:{address[1]}"


@dataclass(frozen=True, slots=True)
class LoadReport:
    clients: int
    serial: int  # grows with every report, so a silent member goes stale

    def encode(self) -> bytes:
        return json.dumps({"clients": self.clients, "serial": self.serial}).encode()

    @classmethod
    def decode(cls, content: bytes) -> LoadReport | None:
        try:
            value = json.loads(content)
            clients, serial = value["clients"], value["serial"]
        except (ValueError, TypeError, KeyError):
            return None
        if not (isinstance(clients, int) and isinstance(serial, int)) or clients < 0:
            return None
        return cls(clients, serial)


def clients_to_move(mine: int, others: Sequence[int], percent: int, period: float) -> int:
    """How many of its ``mine`` clients a member moves this round: none unless it is above
    the average (rounded up; rounded down while some member is below that), at most
    ``percent`` % per second (at least one), never below the average."""
    if percent <= 0 or not others:
        return 0
    average = (mine + sum(others)) / (1 + len(others))
    target = math.floor(average) if min(others) < math.floor(average) else math.ceil(average)
    excess = mine - target
    if excess <= 0:
        return 0
    return min(excess, max(1, int(mine * percent / 100 * period)))


class Rebalancer:
    """One member's reports and moves; :meth:`step` is one round, :meth:`run` the loop."""

    def __init__(
        self,
        *,
        me: tuple[str, int],
        members: Sequence[tuple[str, int]],
        percent: int,
        hub: Hub,
        publishing: PublishPath,
        readiness: Callable[[], str | None],
        drain: Drain,
        connections: Callable[[], Iterable[DrainConnection]],
        rng: random.Random | None = None,
    ) -> None:
        self._me = load_subject(me)
        self._peers = [load_subject(m) for m in members if m != me]
        self._percent = percent
        self._hub = hub
        self._publishing = publishing
        self._readiness = readiness
        self._drain = drain
        self._connections = connections
        self._rng = rng or random.Random()
        self._serial = 0
        self._started: float | None = None
        self._seen: dict[str, tuple[int, float]] = {}  # subject -> (serial, when it changed)

    @classmethod
    def for_server(cls, server: Server) -> Rebalancer:
        config = server.config
        assert config.cluster_member_listen is not None
        return cls(
            me=config.cluster_member_listen,
            members=config.cluster_members,
            percent=config.cluster_rebalance_rate,
            hub=server.ctx.hub,
            publishing=server.ctx.publishing,
            readiness=server.ctx.readiness,
            drain=server.drain,
            connections=lambda: server.connections,
        )

    async def run(self) -> None:
        log.info("rebalancing on: up to %d %% of the clients per second", self._percent)
        while True:
            await trio.sleep(PERIOD)
            self.step(trio.current_time())

    def clients(self) -> list[DrainConnection]:
        return [c for c in self._connections() if _is_client(c.session)]

    def peer_counts(self, now: float) -> list[int]:
        """Client counts of the members heard from recently."""
        counts = []
        for subject in self._peers:
            snapshot = self._hub.snapshot(subject)
            report = None if snapshot is None else LoadReport.decode(snapshot.content)
            if report is None:
                continue
            serial, since = self._seen.get(subject, (-1, now))
            if report.serial != serial:
                self._seen[subject] = (report.serial, now)
            elif now - since > STALE_AFTER:
                continue
            counts.append(report.clients)
        return counts

    def step(self, now: float) -> int:
        """Report, then move what the average asks for; the number of clients picked."""
        self._drain.close_settled()
        clients = [c for c in self.clients() if id(c.session) not in self._drain.moving]
        self._serial += 1
        report = LoadReport(len(clients), self._serial)
        self._publishing.submit(Message(self._me, report.encode(), retained=True), None, now)
        others = self.peer_counts(now)
        if self._started is None:
            self._started = now
        warming_up = now - self._started < WARM_UP
        if warming_up or self._drain.draining or self._readiness() is not None:
            return 0
        count = clients_to_move(len(clients), others, self._percent, PERIOD)
        if count:
            picked = self._rng.sample(clients, count)
            log.info("moving %d of %d clients to other members (they have %s)",
                     count, len(clients), sorted(others))
            self._drain.move(picked)
        return count


def _is_client(session: Any) -> bool:
    return bool(session.is_websocket and session.connected and not session.closing)
