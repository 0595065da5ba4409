"""The server's monitoring: /metrics, /stats with statistics windows, /cluster, and push
monitoring on meta-subjects.

One :class:`Monitor` per server. It reads the server's counters (never on the delivery
path: the collector runs when Prometheus scrapes), samples the main indicators once a
second into the statistics windows (:mod:`migratory.model.stat_windows`) and, when
``MonitorToken`` is set, publishes the meta-subjects (:mod:`.meta_subjects`) every
``MonitorPushInterval`` seconds through the server's own publish path, so that in a
Guaranteed cluster every member's subscribers see every member's figures.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Protocol

import trio

from migratory.model.outbox import PEAK_WINDOW_SECONDS
from migratory.model.stat_windows import RateMeter, StatisticsWindows
from migratory.protocol.http import Request, response
from migratory.server import metric_buckets, metric_figures
from migratory.server.dashboard import DashboardConfig
from migratory.server.meta_subjects import CLUSTER_SUBJECT, meta_message, stats_subject

if TYPE_CHECKING:
    from prometheus_client import CollectorRegistry

    from migratory.config import Config
    from migratory.listeners import Listener
    from migratory.server.context import ServerContext
    from migratory.server.frontends import FrontendCounts

log = logging.getLogger("migratory.monitor")

SAMPLE_SECONDS = 1.0
MONITOR_PATHS = frozenset({"/metrics", "/stats", "/cluster"})
# indicator -> the statistics counter whose per-second rate it is (None: sampled as is)
INDICATORS: tuple[tuple[str, str | None], ...] = (
    ("clients", None),
    ("messages_in_per_second", "publishes_received"),
    ("messages_out_per_second", "frames_fanned_out"),
    ("bytes_out_per_second", "bytes_written"),
    ("latency_ms", None),
)


class MonitoredServer(Protocol):
    """What the monitor reads of its server (:class:`migratory.server.app.Server`, which
    builds it and passes itself)."""

    config: Config
    ctx: ServerContext
    frontends: FrontendCounts
    listeners: list[Listener]


class Monitor:
    """Figures of one server for /metrics, /stats, /cluster and the meta-subjects."""

    def __init__(
        self,
        server: MonitoredServer,
        *,
        cluster_metrics: Callable[[], metric_figures.ClusterMetrics | None] | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._server = server
        self._config = server.config
        self._cluster_metrics = cluster_metrics
        self._clock = clock
        self.windows = StatisticsWindows(tuple(name for name, _ in INDICATORS))
        self._rates = RateMeter()
        self._latency_seen = (0, 0.0)  # fan-out histogram (count, sum) at the last sample
        self.last_rates: dict[str, float | None] = {}
        self._next_peak_window = 0.0
        self._registry: CollectorRegistry | None = None  # at the first scrape
        self.pushed = 0

    # --- metrics.MetricsSource ----------------------------------------------------------

    @property
    def timings(self) -> metric_figures.PublishTimings:
        return self._server.ctx.publishing.timings

    @property
    def batch_sizes(self) -> metric_buckets.BatchSizes:
        return self._server.ctx.batch_sizes

    def statistics(self) -> dict[str, Any]:
        return self._server.ctx.statistics()

    def ready(self) -> bool:
        return self._server.ctx.readiness() is None

    def frontends(self) -> tuple[dict[str, int], int, int]:
        """Kept as connections come and go, never a walk over them (frontends.py)."""
        server = self._server
        budget = server.ctx.outbox_budget
        used, largest = (0, 0) if budget is None else (budget.used, budget.largest)
        return dict(server.frontends.counts), used, largest

    def cluster_metrics(self) -> metric_figures.ClusterMetrics | None:
        return None if self._cluster_metrics is None else self._cluster_metrics()

    # --- statistics windows ---------------------------------------------------------------

    def sample(self, now: float) -> None:
        """Add one sample of every indicator to the windows (called once a second)."""
        stats = self.statistics()
        counters = {name: float(stats[key]) for name, key in INDICATORS if key is not None}
        values: dict[str, float | None] = dict(self._rates.rates(counters, now))
        values["clients"] = float(stats["connections_open"])
        fanout = self.timings.fanout
        count, total = fanout.count, fanout.sum
        seen_count, seen_total = self._latency_seen
        self._latency_seen = (count, total)
        values["latency_ms"] = (
            (total - seen_total) / (count - seen_count) * 1000 if count > seen_count else None
        )
        self.last_rates = values
        self.windows.sample(values, now)
        budget = self._server.ctx.outbox_budget
        if budget is not None and now >= self._next_peak_window:
            budget.next_window()  # migratory_outbox_bytes_max: the last 10-20 s
            self._next_peak_window = now + PEAK_WINDOW_SECONDS

    def windows_report(self) -> dict[str, Any]:
        return {
            "indicators": self.windows.report(self._clock()),
            "sample_seconds": SAMPLE_SECONDS,
            "last_sample": self.last_rates,
        }

    # --- HTTP -------------------------------------------------------------------------------

    def route(self, request: Request, *, monitoring_listener: bool) -> bytes | None:
        """The answer to a monitoring path; None for a path that is not one."""
        if request.path not in MONITOR_PATHS:
            return None
        if not monitoring_listener and self._config.monitor_listen is not None:
            return _error(404, f"{request.path} is served on the monitoring listener "
                               "(MonitorListen)")
        if request.path == "/metrics":
            return self._metrics()
        if request.path == "/stats":
            body = {**self.statistics(), "windows": self.windows_report()}
            return _json(body)
        status = self._server.ctx.cluster_status
        if status is None:
            return _error(404, "not a cluster member")
        return _json(status())

    def _metrics(self) -> bytes:
        """``GET /metrics``. ``prometheus_client`` (with what it imports, about 130
        modules: ~40 ms of CPU, once) is imported at the first scrape, not at start-up:
        a member that is never scraped never pays it (migratory/server/metric_figures.py)."""
        from migratory.server import metrics

        if self._registry is None:
            self._registry = metrics.registry_for(self)
        return response(200, metrics.render(self._registry), content_type=metrics.CONTENT_TYPE)

    def dashboard_config(self) -> DashboardConfig:
        """What the dashboard page needs (:mod:`migratory.server.dashboard`)."""
        return DashboardConfig(
            client_listeners=[
                (*listener.address, listener.encrypted)
                for listener in self._server.listeners
                if not listener.mqtt_tcp and listener.speaks("native")
            ],
            token=self._config.monitor_token,
            push_interval=self._config.monitor_push_interval,
            member=self.member(),
        )

    # --- push monitoring ----------------------------------------------------------------

    def member(self) -> str:
        cluster = self.cluster_metrics()
        return self._config.server_name if cluster is None else cluster.member

    def push(self, now: float) -> int:
        """Publish the meta-subjects once (when there is a MonitorToken and the member is
        ready); how many messages were submitted."""
        ctx = self._server.ctx
        if not self._config.monitor_token or ctx.readiness() is not None:
            return 0
        member = self.member()
        body = {
            "server": self._config.server_name,
            "time": time.time(),
            "counters": self.statistics(),
            "windows": self.windows_report(),
        }
        messages = [meta_message(stats_subject(member), "stats", member, body)]
        if ctx.cluster_status is not None:
            status = {"time": time.time(), "status": ctx.cluster_status()}
            messages.append(meta_message(CLUSTER_SUBJECT, "cluster", member, status))
        for message in messages:
            ctx.publishing.submit(message, None, now)
        self.pushed += len(messages)
        return len(messages)

    async def run(self) -> None:
        """Sample every second and push every MonitorPushInterval seconds, until cancelled.
        A failure of one round is logged, never the end of the server."""
        # On an absolute schedule: a push every `interval` s exactly (the dashboard counts
        # on it), not every interval plus the time a round took.
        interval = self._config.monitor_push_interval
        next_sample = trio.current_time() + SAMPLE_SECONDS
        next_push = trio.current_time() + interval
        while True:
            await trio.sleep_until(next_sample)
            now = trio.current_time()
            while next_sample <= now:  # a round late skips the slots it missed
                next_sample += SAMPLE_SECONDS
            try:
                self.sample(self._clock())
                if now >= next_push:
                    while next_push <= now:
                        next_push += interval
                    self.push(now)
            except Exception:
                log.exception("monitoring: sampling or pushing failed; trying again")


def _json(body: Any) -> bytes:
    data = json.dumps(body, sort_keys=True, default=str).encode() + b"\n"
    return response(200, data, content_type="application/json")


def _error(status: int, reason: str) -> bytes:
    return response(status, (reason + "\n").encode())
