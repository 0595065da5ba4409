"""What every session of one server shares."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

from migratory.config import Config
from migratory.entitlement import Entitlement
from migratory.server.hub import Hub


@dataclass(slots=True)
class ServerStatistics:
    """Counters; read them through :meth:`ServerContext.statistics`."""

    connections_accepted: int = 0
    connections_open: int = 0
    sessions_opened: int = 0
    publishes_received: int = 0
    publishes_refused: int = 0
    protocol_errors: int = 0
    slow_consumers: int = 0
    bytes_written: int = 0
    writes: int = 0


@dataclass(slots=True)
class ServerContext:
    config: Config
    hub: Hub
    entitlement: Entitlement
    stats: ServerStatistics

    def statistics(self) -> dict[str, Any]:
        """A JSON-ready snapshot of the counters and hub figures."""
        return {
            "server": self.config.server_name,
            "epoch": self.hub.epoch,
            **asdict(self.stats),
            **asdict(self.hub.statistics()),
        }
