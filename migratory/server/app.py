"""The single-node server: listening sockets, the batch tick, shutdown."""

from __future__ import annotations

import functools
import logging
import math
import os
import ssl
import time
from collections.abc import Callable
from typing import Any, Protocol, runtime_checkable

import trio

from migratory.config import Config
from migratory.entitlement import entitlement_from_config
from migratory.listeners import Listener, bound, client_listeners
from migratory.model.outbox import OutboxBudget
from migratory.model.position import new_epoch
from migratory.protocol import close_codes
from migratory.server import loop_gaps
from migratory.server.audit import Audit
from migratory.server.client_accept import accept_clients
from migratory.server.connection import OPERATIONS_PER_TURN, Connection
from migratory.server.context import (
    TRIO_CLOCK,
    LocalPublishing,
    PublishPath,
    ServerContext,
    ServerStatistics,
)
from migratory.server.drain import Drain
from migratory.server.encrypted_batching import EncryptedBatches, ticks_per_encrypted_batch
from migratory.server.faults import DeliveryFault
from migratory.server.front_rate import ConnectionRate
from migratory.server.frontends import FrontendCounts
from migratory.server.handshake_share import HandshakeShare
from migratory.server.heartbeats import Heartbeats
from migratory.server.hub import Hub
from migratory.server.invalid_subjects import InvalidSubjectLog
from migratory.server.limits import ConnectionLimits, RefusalLog
from migratory.server.listen_sockets import open_listeners
from migratory.server.loop_turns import TURN_UNITS, TurnGate
from migratory.server.memory import MemoryTrim
from migratory.server.meta_subjects import MetaSubjectEntitlement
from migratory.server.metric_figures import ClusterMetrics
from migratory.server.monitor import Monitor
from migratory.server.monitor_listener import monitoring_tls, serve_monitoring
from migratory.server.mqtt_expiry import SessionExpiry
from migratory.server.mqtt_saving import save_due_positions
from migratory.server.mqtt_takeover import TAKEOVER_SUBJECT, Takeovers
from migratory.server.read_barrier import ReadBarrier
from migratory.server.rebalance import Rebalancer
from migratory.server.uring_writer import UringWriter, open_send_path
from migratory.server.wall_clock import WallClockWatch
from migratory.tls import server_context

log = logging.getLogger("migratory.server")

TICK_SECONDS = 0.1  # conflation periods are multiples of 100 ms
EXPIRE_EVERY_TICKS = 10
EXPIRE_SUBJECTS_PER_TICK = 2000  # the most subjects an expiry tick looks at (a few ms)
EXPIRE_SWEEPS = 10  # sweeps over every subject per CacheExpireTime
SHUTDOWN_GRACE_SECONDS = 1.0


def expire_budget(subjects: int, expire_seconds: float) -> int:
    """Subjects one tick looks at: every subject once per CacheExpireTime / EXPIRE_SWEEPS,
    so a message is kept at most ~1.1 times CacheExpireTime; never more than
    EXPIRE_SUBJECTS_PER_TICK. (A fixed 2,000 per tick swept 10,000 subjects twice a
    second, ~7 ms of CPU per second for nothing: their messages last 180 s.)"""
    per_tick = math.ceil(subjects * TICK_SECONDS * EXPIRE_SWEEPS / expire_seconds)
    return max(1, min(EXPIRE_SUBJECTS_PER_TICK, per_tick))


def build_hub(config: Config, *, epoch: int | None = None, numbered_elsewhere: bool = False,
              hold_sessions: bool = False) -> Hub:
    """The hub ``config`` describes; ``epoch`` defaults to a new random one
    (``hold_sessions``: :class:`~migratory.server.hub_sinks.SessionHolds`)."""
    return Hub(
        epoch=new_epoch() if epoch is None else epoch,
        max_cached_messages=config.max_cached_messages_per_subject,
        cache_expire_seconds=config.cache_expire_time,
        cache_memory_budget=config.cache_memory_budget,
        max_message_size=config.max_message_size,
        publish_snapshot=config.publish_snapshot_message,
        numbered_elsewhere=numbered_elsewhere,
        on_invalid_subject=InvalidSubjectLog().note,
        hold_sessions=hold_sessions,
    )


class Server:
    """Listening sockets, sessions, batching and shutdown around one hub.

    A single node is ``Server(config)``. A cluster member is built by the cluster
    package with its own ``hub``, ``publishing`` path (publishes go to the cluster),
    ``readiness`` (why new clients must wait), ``cluster_status`` (``GET
    /cluster``), ``cluster_metrics`` (Raft and links in ``GET /metrics``) and
    ``cluster_activity`` (a count of the cluster work it takes in before its hub sees
    it -- publishes other members forwarded, Raft entries -- for :meth:`activity`):
    the server is complete when built and nothing is patched later.
    """

    def __init__(
        self,
        config: Config,
        *,
        hub: Hub | None = None,
        publishing: PublishPath | None = None,
        readiness: Callable[[], str | None] | None = None,
        cluster_status: Callable[[], dict[str, Any]] | None = None,
        cluster_metrics: Callable[[], ClusterMetrics | None] | None = None,
        cluster_activity: Callable[[], int] | None = None,
    ) -> None:
        self.config = config
        self._cluster_activity = cluster_activity or (lambda: 0)
        hub = build_hub(config) if hub is None else hub
        hub.fault = DeliveryFault.from_environment(os.environ)
        if hub.fault is not None:
            hub.fault.report = log.warning
            log.warning("%s (never use in production)", hub.fault.describe())
        self.drain = Drain(config.drain_time)  # SIGTERM: clients leave first (drain.py)
        if publishing is None:
            publishing = LocalPublishing(hub, clock=TRIO_CLOCK)
        self.monitor = Monitor(self, cluster_metrics=cluster_metrics)
        self.ctx = ServerContext(
            config,
            hub,
            # meta-subjects (/migratory/...): only MonitorToken holders may subscribe
            MetaSubjectEntitlement(entitlement_from_config(config), config.monitor_token),
            ServerStatistics(),
            self.drain.publishing(publishing),
            readiness=self.drain.readiness(readiness or (lambda: None)),
            cluster_status=cluster_status,
            audit=Audit.from_config(config),
            monitor=self.monitor,
            # without OutboxMemoryBudget one that never refuses: GET /metrics reads the
            # outboxes' total and largest from it
            outbox_budget=OutboxBudget(config.outbox_memory_budget or OutboxBudget.UNLIMITED),
        )
        self.ctx.loop_gaps = loop_gaps.LoopGaps()
        # the work per loop turn over every connection, and the queue of those left over
        self.turns = TurnGate(TURN_UNITS, OPERATIONS_PER_TURN)
        self.ctx.loop_turns = self.turns.budget
        if getattr(publishing, "commits_elsewhere", False):  # a Guaranteed member, a worker
            self.ctx.read_barrier = ReadBarrier(self.ctx.publishing, trio.current_time)
        self.connections: set[Connection] = set()
        self.frontends = FrontendCounts()  # the connections per front end (GET /metrics)
        self.admission = ConnectionLimits(config)  # limits.py (re-read at serve)
        self.front_rate = ConnectionRate(config.max_connection_rate_per_address)  # at accept
        self.tls_share = HandshakeShare(config.max_tls_handshake_rate)  # the TLS ports'
        self._refusal_log = RefusalLog()  # one line per kind of refusal a minute
        self.tls_failure_log = RefusalLog()  # a stranger's garbage: one line a minute
        self._trim = MemoryTrim()  # memory.py
        self.dirty: set[Connection] = set()  # wait for the batch tick
        self.write_immediately = config.batch_time == 0
        # adaptive batching (BatchIdleWrite): a connection written to since the batch tick
        # before last waits for the next tick; any other is written at the end of the
        # current scheduler pass, so a quiet client gets its message at once and a busy
        # one still gets at most about one write per BatchTime plus one
        self.idle_write = config.batch_idle_write and not self.write_immediately
        # clients of encrypted listeners: a batch every few ticks (encrypted_batching.py)
        every = ticks_per_encrypted_batch(config.batch_time, config.encrypted_batch_time)
        self.encrypted: EncryptedBatches[Connection] | None = (
            EncryptedBatches(every, idle_write=self.idle_write) if every > 1 else None
        )
        self.urgent: set[Connection] = set()
        # the connection whose input is being processed (Connection._read_once): the idle
        # writes its processing causes are written when it is done, by that same task
        # (write_urgent), without waking the idle-write task; None: nobody, wake it
        self.processing: Connection | None = None
        # deliveries written (by a tick or an idle write; a client's replies to its own
        # requests do not count) since the last tick, and in the tick interval before
        self.written: set[Connection] = set()
        self.written_before: set[Connection] = set()
        self._urgent_wake = trio.Event()
        self._nursery: trio.Nursery | None = None
        self.addresses: list[tuple[str, int]] = []
        self.mqtt_addresses: list[tuple[str, int]] = []
        self.mqtt_sessions: dict[str, Any] = {}  # MQTT client id -> its live session
        if self.ctx.read_barrier is not None:  # processes elsewhere: one connection per id
            takeovers = Takeovers(self.ctx.publishing, self.mqtt_sessions, trio.current_time)
            self.ctx.takeovers = takeovers
            self.ctx.hub.listen(takeovers, TAKEOVER_SUBJECT, 0)
        self._mqtt_expiry = SessionExpiry(self.ctx, self.mqtt_sessions)  # mqtt_expiry.py
        self._wall_clock = WallClockWatch()  # wall_clock.py: its steps said
        # the native sessions that asked for heartbeats, swept every tick (heartbeats.py)
        self.heartbeats = Heartbeats(config.client_heartbeat_minimum, TICK_SECONDS)
        self.ctx.heartbeats = self.heartbeats
        self.listeners: list[Listener] = []  # as bound (port 0 resolved)
        self._tls: ssl.SSLContext | None = None
        self.monitor_address: tuple[str, int] | None = None
        # SendPath = io_uring: the writes of plain connections (uring_writer.py); None: send()
        self.uring: UringWriter | None = None

    @property
    def nursery(self) -> trio.Nursery:
        assert self._nursery is not None, "server is not running"
        return self._nursery

    async def serve(
        self, *, task_status: trio.TaskStatus[list[tuple[str, int]]] = trio.TASK_STATUS_IGNORED
    ) -> None:
        """Run until cancelled; ``task_status.started`` gets the bound addresses."""
        specs = client_listeners(self.config)
        if any(spec.encrypted for spec in specs):
            self._tls = server_context(self.config)
        listeners = open_listeners(
            [(spec.address, spec.config_key) for spec in specs],
            reuse_port=self.config.workers > 1,
        )
        self.admission = ConnectionLimits(self.config)  # the open-file limit as it is now
        bound_addresses = [sock.getsockname()[:2] for sock in listeners]
        self.listeners = [
            bound(spec, address) for spec, address in zip(specs, bound_addresses, strict=True)
        ]
        self.addresses = [lst.address for lst in self.listeners if not lst.mqtt_tcp]
        self.mqtt_addresses = [lst.address for lst in self.listeners if lst.mqtt_tcp]
        try:
            async with trio.open_nursery() as nursery:
                self._nursery = nursery
                self.uring = open_send_path(self.config.send_path)  # uring_writer.py
                if self.uring is not None:
                    nursery.start_soon(self.uring.run)
                for sock, listener in zip(listeners, self.listeners, strict=True):
                    nursery.start_soon(
                        accept_clients, self, sock, listener,
                        self._tls if listener.encrypted else None,
                    )
                if not self.write_immediately:
                    nursery.start_soon(self._batch_loop)
                if self.idle_write:
                    nursery.start_soon(self._idle_write_loop)
                nursery.start_soon(self._tick_loop)
                nursery.start_soon(loop_gaps.probe, self.ctx.loop_gaps)
                nursery.start_soon(self.monitor.run)
                if self.config.monitor_listen is not None:
                    self.monitor_address = await nursery.start(
                        functools.partial(
                            serve_monitoring, wrap=monitoring_tls(self.config)
                        ),
                        self.ctx,
                        self.config.monitor_listen,
                    )
                if self.config.cluster_rebalance_rate and self.config.clustered:
                    nursery.start_soon(Rebalancer.for_server(self).run)  # rebalance.py
                log.info(
                    "epoch %d, batching %s, entitlement %s",
                    self.ctx.hub.epoch,
                    f"{self.config.batch_time} ms" if self.config.batch_time else "off",
                    self.ctx.entitlement.name,
                )
                task_status.started(self.addresses)
        finally:
            for sock in listeners:
                sock.close()

    def activity(self) -> int:
        """Grows with every publish received -- from a client, or forwarded by another
        member --, every Raft entry a seed took (a follower's from its leader), and every
        message the hub published or fanned out: unchanged over a second means idle
        (:func:`~migratory.server.gc_pauses.collect_when_idle`).

        Received, not only published: a seed of an overloaded cluster can apply nothing
        for a second (its Raft commits come late) while publishes pour in, and its
        "idle" full collection walked every one waiting for its commit (100-1,000 ms
        loop stops, docs/benchmarks.md). Received, not CPU: the second after a burst of
        connections is busy but publish-less, and its collection is the one wanted.
        Raft entries: a follower seed's clients may publish nothing while the leader's
        entries pour in and their commits come late."""
        stats = self.ctx.stats
        return self.ctx.hub.activity + stats.publishes_received + self._cluster_activity()

    def refused(self, kind: str, reason: str) -> None:
        """Count a connection refused or closed before its handshake was done (by kind:
        ``migratory_connections_refused_total``); log one line per kind a minute."""
        stats = self.ctx.stats
        stats.connections_refused += 1
        stats.count(stats.refusals, kind)
        unlogged = self._refusal_log.line(kind, trio.current_time())
        if unlogged is not None:
            more = f" ({unlogged} more like it not logged)" if unlogged else ""
            log.warning("connection refused: %s%s", reason, more)

    def forget(self, connection: Connection) -> None:
        self.drain.left(connection)  # (its end may end the drain)
        if connection in self.connections:
            self.frontends.closed(connection.frontend)
            self.admission.release(connection)
            self.ctx.stats.handshakes_pending = self.admission.pending_handshakes
            self._trim.closed()
        self.connections.discard(connection)
        self.heartbeats.forget(connection.session)
        self.dirty.discard(connection)
        self.urgent.discard(connection)
        self.written.discard(connection)
        self.written_before.discard(connection)
        if self.encrypted is not None:
            self.encrypted.forget(connection)
        self.ctx.stats.connections_open = len(self.connections)

    def mark_dirty(self, connection: Connection) -> None:
        """``connection`` has bytes to write: at the next tick, or at once if it is idle."""
        if connection.batch_slowly:  # an encrypted listener's client
            assert self.encrypted is not None
            if self.encrypted.mark(connection):
                self.urgent.add(connection)
                if self.processing is None:
                    self._urgent_wake.set()
            return
        if (
            not self.idle_write
            or connection in self.written
            or connection in self.written_before
        ):
            self.dirty.add(connection)
        else:
            self.urgent.add(connection)
            if self.processing is None:
                self._urgent_wake.set()

    def write_urgent(self) -> None:
        """Write to the idle connections that have bytes waiting (each once, whatever it
        was given since the last call: what one client's input delivers goes out in one
        write per subscriber)."""
        urgent, self.urgent = self.urgent, set()
        self.written |= urgent
        self._flush_each(urgent)

    def _flush_each(self, connections: set[Connection]) -> None:
        uring = self.uring
        if uring is not None:
            uring.hold()  # their sends in one submission
        try:
            for connection in connections:
                connection.flush()
        finally:
            if uring is not None:
                uring.release()

    def wake_idle_writes(self) -> None:
        """Have the idle-write task write what waits (processing ended without doing so)."""
        if self.urgent:
            self._urgent_wake.set()

    async def _idle_write_loop(self) -> None:
        """Write to idle connections once the current scheduler pass is done, for what
        did not come from a client's input (a cluster peer's messages, conflation ticks):
        input is followed by :meth:`write_urgent` in its own task."""
        while True:
            await self._urgent_wake.wait()
            self._urgent_wake = trio.Event()
            self.write_urgent()

    def flush_dirty(self) -> None:
        dirty = self.dirty
        if not dirty:
            return
        self.dirty = set()
        self._flush_each(dirty)

    def batch_tick(self) -> None:
        """Write every batch that waits; remember whom (deliveries written by this tick or
        by idle writes until the next one)."""
        self.written_before, self.written = self.written, set(self.dirty)
        self.flush_dirty()
        encrypted = self.encrypted
        if encrypted is not None:
            for connection in encrypted.tick():
                connection.flush()

    async def _batch_loop(self) -> None:
        """Flush on an absolute schedule, so a batch waits at most BatchTime.

        Sleeping BatchTime *after* each flush would add the flush's own duration
        (~12 ms for 1000 sockets) to every cycle. When a flush overruns the next
        tick, the following one starts at once.
        """
        interval = self.config.batch_time / 1000
        next_tick = trio.current_time() + interval
        while True:
            await trio.sleep_until(next_tick)
            self.batch_tick()
            next_tick = max(next_tick + interval, trio.current_time())

    async def _tick_loop(self) -> None:
        ticks = 0
        hub = self.ctx.hub
        while True:
            await trio.sleep(TICK_SECONDS)
            now = trio.current_time()
            hub.tick(now)
            ticks += 1
            forgotten = hub.forgotten
            self._expire(now)  # a slice of the subjects each tick
            self._trim.forgot(hub.forgotten - forgotten)
            self._mqtt_expiry.sweep(now, SessionExpiry.budget(hub.subject_count, TICK_SECONDS))
            if self.ctx.mqtt_saves_due:
                save_due_positions(self.ctx.mqtt_saves_due)
            self.heartbeats.sweep()
            if ticks % EXPIRE_EVERY_TICKS == 0:
                if self._wall_clock.check():
                    self.ctx.stats.wall_clock_steps += 1
                self._trim.maybe_trim(now)
                self._close_expired_sessions()
            if self.write_immediately:
                self.flush_dirty()

    def _expire(self, now: float) -> None:
        hub = self.ctx.hub
        budget = expire_budget(hub.subject_count, self.config.cache_expire_time)
        expired = hub.expire(now, budget=budget)
        if expired:
            self.ctx.stats.cache_expired += expired
            audit = self.ctx.audit
            if audit is not None and audit.cache:
                audit.event("cache", "expired", messages=expired)

    def _close_expired_sessions(self) -> None:
        """Sessions whose token expired: close 4503 (the SDK reconnects with a fresh one)."""
        if self.ctx.entitlement.name in ("None", "Basic"):
            return  # no rights that end
        wall = time.time()
        for connection in list(self.connections):
            session = connection.session
            expires_at = session.expires_at
            if expires_at is not None and expires_at <= wall:
                session.expires_at = None
                session.close(close_codes.TOKEN_EXPIRED.code, "the token expired")
                connection.flush()

    def shed_clients(self, code: int, reason: str) -> int:
        """Close every client session with ``code`` (they reconnect elsewhere); the count."""
        shed = 0
        for connection in list(self.connections):
            session = connection.session
            if session.is_websocket:
                session.close(code, reason)
                shed += 1
            connection.flush()
        return shed

    async def shutdown(self) -> None:
        """Tell every client we are going away (1001), give them a moment, stop."""
        for connection in list(self.connections):
            session = connection.session
            if session.is_websocket:
                session.close(close_codes.GOING_AWAY.code, "server shutting down")
            connection.flush()
        with trio.move_on_after(SHUTDOWN_GRACE_SECONDS):
            while any(c.session.outbox for c in self.connections):
                await trio.sleep(0.02)
        self.nursery.cancel_scope.cancel()


class Role(Protocol):
    """Something that runs beside a server for its lifetime (a cluster member's roles)."""

    async def run(self, *, task_status: trio.TaskStatus[None] = ...) -> None: ...


@runtime_checkable
class LeavingRole(Role, Protocol):
    """A role with something to do once a SIGTERM's drain is over and the server has
    stopped, before the process ends (a Standard member's goodbyes): bounded by itself."""

    async def leave(self) -> None: ...
