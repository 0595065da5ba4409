"""What every session of one server shares."""

from __future__ import annotations

import sys
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Any, Final, Protocol

import trio

from migratory import client_lines, logs
from migratory.config import Config
from migratory.entitlement_decisions import Entitlement
from migratory.model.message import Message
from migratory.model.outbox import OutboxBudget
from migratory.model.position import Position
from migratory.protocol import close_codes, ops
from migratory.server.audit import Audit
from migratory.server.hub import Hub
from migratory.server.metric_buckets import BatchSizes
from migratory.server.metric_figures import PublishTimings

if TYPE_CHECKING:
    from concurrent.futures import Future

    from migratory.protocol.http import Request
    from migratory.server.dashboard import DashboardConfig
    from migratory.server.heartbeats import Heartbeats


class PublishReply(Protocol):
    """Who hears a publish's outcome (a session)."""

    def publish_result(self, status: ops.PublishStatus) -> None: ...

    def publish_ok(self, closure: str | None, subject: str, epoch: int, seq: int) -> None:
        """``publish_result(PublishStatus(PUBLISH_OK, closure, subject, Position(epoch,
        seq)))``: what the local path says of each acknowledged publish (a session
        encodes it without making the status)."""

    def flush(self) -> None: ...


def publish_ok_status(closure: str | None, subject: str, epoch: int, seq: int) -> ops.PublishStatus:
    """The status :meth:`PublishReply.publish_ok` stands for."""
    return ops.PublishStatus(ops.Status.PUBLISH_OK, closure, subject, Position(epoch, seq))


class PublishPath(Protocol):
    """Where validated, entitled publishes go: the local hub, or the cluster."""

    timings: PublishTimings  # latencies of this member's own publishes (GET /metrics)

    def submit(self, message: Message, reply: PublishReply | None, now: float) -> None: ...

    def statistics(self) -> dict[str, Any]: ...


class MonitoringRoutes(Protocol):
    """What the fronts ask of the monitor (:class:`migratory.server.monitor.Monitor`, which
    the server builds on this context: it is named here by what is asked of it)."""

    def route(self, request: Request, *, monitoring_listener: bool) -> bytes | None: ...

    def dashboard_config(self) -> DashboardConfig: ...


class ReadBarrierJoin(Protocol):
    """A CONNECT's wait for what was committed before it
    (:class:`migratory.server.read_barrier.ReadBarrier`)."""

    def join(self) -> Future[bool]: ...


class TakeoverNotices(Protocol):
    """An accepted CONNECT tells the other processes of its client id
    (:class:`migratory.server.mqtt_takeover.Takeovers`)."""

    def announce(self, client_id: str, now: float, key: str = "") -> str: ...


TRIO_CLOCK: Final = object()
"""``LocalPublishing(clock=TRIO_CLOCK)``: the running trio clock, taken at the first publish
(the hub is built before trio runs)."""


class LocalPublishing:
    """A single node numbers messages itself: acknowledged at once.

    ``clock`` (the clock of ``now``: trio's, or :data:`TRIO_CLOCK`) times each publish for
    ``timings``; without it nothing is timed."""

    settles_at_once = True
    """Every publish has its outcome before :meth:`submit` returns: a drain has nothing in
    flight to wait for (:class:`~migratory.server.drain.DrainingPublishing` counts nothing)."""

    def __init__(self, hub: Hub, *, clock: Callable[[], float] | object | None = None) -> None:
        self._hub = hub
        self._clock = clock
        self.timings = PublishTimings()

    def _resolve_clock(self) -> Callable[[], float] | None:
        """The clock's own method: ``trio.current_time()`` goes through three calls to
        reach it, ~5 % of a publish at the ceiling (py-spy, benchmarks/publish_ceiling.py)."""
        try:
            clock = trio.lowlevel.current_clock().current_time
        except RuntimeError:  # outside a trio run: an in-process harness
            clock = None
        self._clock = clock
        return clock

    def submit(self, message: Message, reply: PublishReply | None, now: float) -> None:
        positioned = self._hub.publish(message, now)
        clock = self._clock
        if clock is TRIO_CLOCK:
            clock = self._resolve_clock()
        if clock is not None:
            try:
                elapsed = clock() - now  # type: ignore[operator]
            except RuntimeError:  # trio's clock outside a trio run: an in-process harness
                self._clock = None
            else:
                self.timings.fanout.observe(elapsed)
                if reply is not None:
                    self.timings.ack.observe(elapsed)
        if reply is not None:
            reply.publish_ok(message.closure, message.subject, positioned.epoch, positioned.seq)

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
    # every client's subscriptions (MaxSubscriptions): native subjects, MQTT topic filters
    # (registered with the hub), SSE stream subjects
    subscriptions_open: int = 0
    # {limit: count}: subscriptions refused past MaxSubscriptionsPerConnection (an MQTT
    # session's filters: MAX_FILTERS, MAX_WILDCARD_FILTERS) or MaxSubscriptions
    subscriptions_refused: dict[str, int] = field(default_factory=dict)
    subscribes_refused: int = 0  # whole subscribes whose answer would not fit (admission.py)
    connections_refused: int = 0  # over MaxConnections / per address / handshakes in flight
    # {limit: count}: refused at accept, or closed before the handshake was done
    refusals: dict[str, int] = field(default_factory=dict)
    handshakes_pending: int = 0  # connections still in their handshake (MaxPendingHandshakes)
    slow_consumers: int = 0
    mqtt_sessions_opened: int = 0
    mqtt_sessions_resumed: int = 0  # persistent sessions taken up again (clean session 0)
    mqtt_protocol_errors: int = 0  # malformed MQTT packets (each closed its connection)
    mqtt_resyncs: int = 0  # resumed subjects the cache no longer reached: snapshot sent
    mqtt_wills_published: int = 0
    mqtt_sessions_expired: int = 0  # persistent sessions discarded after MqttSessionExpiry
    # connected sessions another member's expiry sweep discarded, saved again (its clock
    # ahead of this member's by half MqttSessionExpiry or more): mqtt_saving.py
    mqtt_sessions_reclaimed: int = 0
    mqtt_sessions_stored: int = 0  # as of the last sweep, plus those created here since
    # positions persistent session records forgot to stay within MqttSessionMaxSubjects,
    # and the session connections that did
    mqtt_session_positions_forgotten: int = 0
    mqtt_positions_dropped: int = 0  # held in memory, past MqttSessionMaxSubjects
    mqtt_sessions_over_subject_bound: int = 0
    bytes_written: int = 0
    writes: int = 0
    bytes_read: int = 0
    cache_expired: int = 0
    wall_clock_steps: int = 0  # steps of the wall clock against the monotonic (wall_clock.py)
    # {kind: count}: http, frame, operation (GET /metrics labels them)
    protocol_error_kinds: dict[str, int] = field(default_factory=dict)
    entitlement_denials: dict[str, int] = field(default_factory=dict)  # {action: count}
    resumes: dict[str, int] = field(default_factory=dict)  # {sync | resync: count}

    # {close code's name: count}: clients the server closed (GET /metrics), 1000 and 1001
    # aside; an MQTT client: MQTT_KEEP_ALIVE, its keep-alive ran out
    closes: dict[str, int] = field(default_factory=dict)

    def count(self, table: dict[str, int], key: str) -> None:
        table[key] = table.get(key, 0) + 1

    def closed(self, code: int | str) -> None:
        """Count a client the server closes with ``code`` (a close code or a name)."""
        known = close_codes.BY_CODE.get(code) if isinstance(code, int) else None
        self.count(self.closes, code if isinstance(code, str) else
                   known.name if known is not None else str(code))


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
    loop_turns: Any = None  # the server's TurnBudget (migratory.server.loop_turns)
    # frames per socket write, counted once per write (GET /metrics)
    batch_sizes: BatchSizes = field(default_factory=BatchSizes)
    audit: Audit | None = None  # None: nothing audited
    # /metrics, /stats with windows, /cluster, meta-subjects (monitor.py)
    monitor: MonitoringRoutes | None = None
    outbox_budget: OutboxBudget | None = None  # OutboxMemoryBudget, shared by every outbox
    # a cluster member's or worker's (read_barrier.py); None: one process, nothing to wait for
    read_barrier: ReadBarrierJoin | None = None
    # the same processes' MQTT takeover notices (mqtt_takeover.py); None: one process
    takeovers: TakeoverNotices | None = None
    heartbeats: Heartbeats | None = None  # the server's (heartbeats.py); None: none granted
    # persistent MQTT sessions whose positions wait for SAVE_INTERVAL to pass, in the
    # order they began to (mqtt_saving.save_due_positions, on the server's tick)
    mqtt_saves_due: dict[Any, None] = field(default_factory=dict)
    # GET /snapshot replies by (subject, as JSON), with the snapshot each was made of
    # (http_routes.py: encoded once per snapshot, the oldest out past 64)
    snapshot_replies: dict[tuple[str, bool], tuple[Any, Any]] = field(default_factory=dict)

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
            "loop_turns": None if self.loop_turns is None else self.loop_turns.statistics(),
            "outbox_bytes": None if self.outbox_budget is None else self.outbox_budget.used,
            "heartbeats": None if self.heartbeats is None else asdict(self.heartbeats.statistics()),
            "log_lines_held": client_lines.lines.held,
            "log_lines_dropped": logs.lines_dropped(),
            # memory blocks the interpreter holds (objects and its own small allocations;
            # not OpenSSL's or the kernel's): what grows if client state outlives clients
            "python_allocated_blocks": sys.getallocatedblocks(),
        }
