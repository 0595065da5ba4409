"""What every session of one server shares."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import Any, Protocol

from migratory.config import Config
from migratory.entitlement import Entitlement
from migratory.model.message import Message
from migratory.protocol import ops
from migratory.server.hub import Hub


class PublishReply(Protocol):
    """Who hears a publish's outcome (a session)."""

    def publish_result(self, status: ops.PublishStatus) -> None: ...

    def flush(self) -> None: ...


class PublishPath(Protocol):
    """Where validated, entitled publishes go: the local hub, or the cluster."""

    def submit(self, message: Message, reply: PublishReply | None, now: float) -> None: ...

    def statistics(self) -> dict[str, Any]: ...


class LocalPublishing:
    """A single node numbers messages itself: acknowledged at once."""

    def __init__(self, hub: Hub) -> None:
        self._hub = hub

    def submit(self, message: Message, reply: PublishReply | None, now: float) -> None:
        positioned = self._hub.publish(message, now)
        if reply is not None:
            reply.publish_result(
                ops.PublishStatus(
                    ops.Status.PUBLISH_OK, message.closure, message.subject, positioned.position
                )
            )

    def statistics(self) -> dict[str, Any]:
        return {"mode": "single"}


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
    mqtt_sessions_opened: int = 0
    mqtt_sessions_resumed: int = 0  # persistent sessions taken up again (clean session 0)
    mqtt_protocol_errors: int = 0  # malformed MQTT packets (each closed its connection)
    mqtt_resyncs: int = 0  # resumed subjects the cache no longer reached: snapshot sent
    mqtt_wills_published: int = 0
    bytes_written: int = 0
    writes: int = 0


@dataclass(slots=True)
class ServerContext:
    config: Config
    hub: Hub
    entitlement: Entitlement
    stats: ServerStatistics
    publishing: PublishPath
    # why new clients must wait (a cluster member still syncing), or None when ready
    readiness: Callable[[], str | None] = field(default=lambda: None)
    cluster_status: Callable[[], dict[str, Any]] | None = None
    gc_pauses: Any = None  # GcPauseStatistics once serving (migratory.server.gc_pauses)
    loop_gaps: Any = None  # LoopGaps once serving (migratory.server.loop_gaps)

    def statistics(self) -> dict[str, Any]:
        """A JSON-ready snapshot of the counters and hub figures."""
        return {
            "server": self.config.server_name,
            "epoch": self.hub.epoch,
            **asdict(self.stats),
            **asdict(self.hub.statistics()),
            "publishing": self.publishing.statistics(),
            "gc": None if self.gc_pauses is None else asdict(self.gc_pauses),
            "loop_gaps": None if self.loop_gaps is None else self.loop_gaps.statistics(),
        }
