"""``GET /metrics``: the server's figures for Prometheus, exposed by ``prometheus_client``.

Nothing here runs per delivery. The server keeps plain counters (``ServerStatistics``,
the hub's figures) and cheap bucket counts (:mod:`migratory.server.metric_buckets`: once
per publish or per socket write, never per subscriber); a :class:`ServerCollector` turns
them into metric families only when Prometheus scrapes. ``prometheus_client`` writes the
exposition format.

``migratory_connections_open`` is what the HPA's custom metric scales on
(deploy/k8s/prometheus-adapter-rule.yaml turns it into ``migratory_connections``).
docs/monitoring.md describes every metric.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any, Protocol

from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)
from prometheus_client.registry import Collector

from migratory.server.metric_buckets import BatchSizes, Buckets
from migratory.server.metric_figures import ClusterMetrics, PublishTimings

CONTENT_TYPE = CONTENT_TYPE_LATEST


class MetricsSource(Protocol):
    """What the collector reads at scrape time (the server's :class:`Monitor`)."""

    @property
    def timings(self) -> PublishTimings: ...

    @property
    def batch_sizes(self) -> BatchSizes: ...

    def statistics(self) -> dict[str, Any]: ...

    def ready(self) -> bool: ...

    def frontends(self) -> tuple[dict[str, int], int, int]:
        """Connections per front end, outbox bytes pending in all, the largest outbox."""
        ...

    def cluster_metrics(self) -> ClusterMetrics | None: ...


# statistics key -> (metric name, type, help); counters are exposed with ``_total``
METRICS: tuple[tuple[str, str, str, str], ...] = (
    ("connections_open", "migratory_connections_open", "gauge",
     "Client connections open now (every front end)."),
    ("subjects", "migratory_subjects", "gauge", "Subjects with a cache or a snapshot."),
    ("subscriptions", "migratory_subscriptions", "gauge", "Live subscriptions."),
    ("cached_messages", "migratory_cache_messages", "gauge",
     "Messages held in the subject caches."),
    ("cache_bytes", "migratory_cache_bytes", "gauge",
     "What the subject caches count against CacheMemoryBudget (0 without a budget)."),
    ("cache_evicted", "migratory_cache_evicted", "counter",
     "Cached messages dropped to stay within CacheMemoryBudget."),
    ("subjects_forgotten", "migratory_subjects_forgotten", "counter",
     "Subjects forgotten once nothing was left to serve (no subscriber, snapshot or "
     "cached message)."),
    ("mqtt_unnamable_messages", "migratory_mqtt_unnamable_messages", "counter",
     "Messages of a subject holding '+' or '#' (valid natively and over HTTP) that no "
     "MQTT wildcard filter was matched against: no MQTT topic name may hold one, so no "
     "MQTT session is sent them (counted while some wildcard filter is held)."),
    ("connections_accepted", "migratory_connections_accepted", "counter",
     "Connections accepted."),
    ("handshakes_pending", "migratory_handshakes_pending", "gauge",
     "Client connections still in their handshake (TLS, HTTP or WebSocket upgrade, "
     "`connect`, MQTT CONNECT) or HTTP keep-alive between requests, every listener "
     "(MaxPendingHandshakes each): those a newcomer may close to make room."),
    ("sessions_opened", "migratory_sessions_opened", "counter",
     "Clients that completed `connect`."),
    ("publishes_received", "migratory_publishes_received", "counter",
     "Publish operations received from clients (messages in)."),
    ("publishes_refused", "migratory_publishes_refused", "counter",
     "Publishes refused before they were submitted (invalid, too large, denied)."),
    ("bytes_read", "migratory_bytes_received", "counter", "Bytes read from clients (bytes in)."),
    ("messages_published", "migratory_messages_published", "counter",
     "Messages numbered into this member's caches."),
    ("frames_fanned_out", "migratory_deliveries", "counter",
     "Messages delivered to subscribers (messages out)."),
    ("bytes_written", "migratory_bytes_written", "counter",
     "Bytes written to clients (bytes out)."),
    ("writes", "migratory_socket_writes", "counter", "Socket writes to clients."),
    ("slow_consumers", "migratory_slow_consumers", "counter",
     "Clients cut off for reading too slowly (close 4500)."),
    ("log_lines_held", "migratory_log_lines_held", "counter",
     "Log lines about single clients logged at DEBUG instead of INFO or WARNING: past one "
     "line per kind every 10 s (a storm of closes, cut-offs, refusals; client_lines.py)."),
    ("log_lines_dropped", "migratory_log_lines_dropped", "counter",
     "Log lines dropped: the log's reader (or its disk) was 10,000 lines behind (logs.py)."),
    ("cache_expired", "migratory_cache_expired", "counter",
     "Cached messages dropped for being older than CacheExpireTime."),
    ("wall_clock_steps", "migratory_wall_clock_steps", "counter",
     "Steps of this member's wall clock of more than 1 s against its monotonic clock (an "
     "NTP correction, a VM resumed, the clock set by hand): each logged at WARNING."),
    ("mqtt_sessions_opened", "migratory_mqtt_sessions_opened", "counter",
     "MQTT clients whose CONNECT was accepted."),
    ("mqtt_sessions_resumed", "migratory_mqtt_sessions_resumed", "counter",
     "MQTT persistent sessions (clean session 0) taken up again."),
    ("mqtt_protocol_errors", "migratory_mqtt_protocol_errors", "counter",
     "MQTT connections closed for a malformed packet."),
    ("mqtt_resyncs", "migratory_mqtt_resyncs", "counter",
     "MQTT subjects the cache no longer reached (the snapshot was sent with RETAIN, or an "
     "empty RETAIN when there is none): at a resume, or live when a cluster cache sync "
     "moved a subject past its cache."),
    ("mqtt_wills_published", "migratory_mqtt_wills_published", "counter",
     "MQTT will messages published."),
    ("mqtt_sessions_stored", "migratory_mqtt_sessions_stored", "gauge",
     "MQTT persistent sessions stored (as of the last sweep, once a minute, plus those "
     "this member created since)."),
    ("mqtt_sessions_expired", "migratory_mqtt_sessions_expired", "counter",
     "MQTT persistent sessions discarded for being away longer than MqttSessionExpiry."),
    ("mqtt_sessions_reclaimed", "migratory_mqtt_sessions_reclaimed", "counter",
     "MQTT persistent sessions connected here that another member's expiry sweep "
     "discarded, saved again: that member's clock is ahead of this one's by about half "
     "MqttSessionExpiry or more."),
    ("mqtt_session_positions_forgotten", "migratory_mqtt_session_positions_forgotten",
     "counter", "Subjects whose position MQTT persistent session records forgot to name "
     "at most MqttSessionMaxSubjects (a resume replays them from the start of their cache)."),
    ("mqtt_sessions_over_subject_bound", "migratory_mqtt_sessions_over_subject_bound",
     "counter", "MQTT persistent session connections whose record reached "
     "MqttSessionMaxSubjects and forgot positions (each logged once)."),
    ("mqtt_positions_dropped", "migratory_mqtt_positions_dropped", "counter",
     "Positions MQTT sessions (clean or persistent) dropped from memory to hold at most "
     "MqttSessionMaxSubjects each (the oldest first; no message is lost)."),
)

# statistics key of a {label value: count} map -> (metric name, label, help)
LABELLED_COUNTERS: tuple[tuple[str, str, str, str], ...] = (
    ("protocol_error_kinds", "migratory_protocol_errors", "kind",
     "Clients closed for breaking the protocol, by kind (http, frame, operation, ...)."),
    ("entitlement_denials", "migratory_entitlement_denials", "action",
     "Requests the entitlement refused, by action (connect, subscribe, publish)."),
    ("refusals", "migratory_connections_refused", "limit",
     "Client connections refused at accept (503, MQTT CONNACK 3, TLS reset) or closed "
     "before their handshake was "
     "done, by limit: MaxConnectionRatePerAddress and MaxTlsHandshakeRate (reset at "
     "accept), MaxConnections, MaxConnectionsPerAddress, MaxHandshakesPerAddress, "
     "MaxPendingHandshakes (the oldest closed for a newcomer; MaxConnections too when "
     "the server was full), HandshakeTimeout."),
    ("subscriptions_refused", "migratory_subscriptions_refused", "limit",
     "Subscriptions refused by the limit that did it: MaxSubscriptionsPerConnection (an "
     "MQTT session: also its 1,000 filters at most), MAX_WILDCARD_FILTERS (an MQTT "
     "session's 100 wildcard filters), MaxSubscriptions (every client's together; an SSE "
     "stream refused whole, 503)."),
    ("closes", "migratory_connections_closed", "reason",
     "Clients the server closed, by close code name (DRAINED, SLOW_CONSUMER, "
     "TRY_AGAIN_LATER, CONNECT_DENIED, ...; 1000 and 1001 aside); MQTT_KEEP_ALIVE: an MQTT "
     "client's keep-alive ran out."),
    ("resumes", "migratory_resumes", "outcome",
     "Subscribes that resumed from a position, by outcome (sync: every missed message "
     "recovered; resync: snapshot and DATA_RESYNC)."),
)


class ServerCollector(Collector):
    """Builds the metric families from a :class:`MetricsSource` on each scrape."""

    def __init__(self, source: MetricsSource) -> None:
        self._source = source

    def collect(self) -> Iterator[Metric]:
        source = self._source
        stats = source.statistics()
        yield _gauge("migratory_ready", "1 when the member accepts clients (as /readyz).",
                     int(source.ready()))
        yield from _plain(stats)
        yield from _labelled(stats)
        by_frontend, outbox_bytes, outbox_max = source.frontends()
        connections = GaugeMetricFamily(
            "migratory_frontend_connections", "Client connections open now, by front end.",
            labels=["frontend"],
        )
        for frontend, count in sorted(by_frontend.items()):
            connections.add_metric([frontend], count)
        yield connections
        yield _gauge("migratory_outbox_bytes", "Bytes queued for clients, not written yet, "
                     "and 176 for each unacknowledged MQTT QoS 1 delivery.", outbox_bytes)
        yield _gauge("migratory_outbox_bytes_max", "The largest single client's queued bytes.",
                     outbox_max)
        timings = source.timings
        yield histogram(
            timings.fanout, "migratory_publish_fanout_seconds",
            "From reading a client's publish to handing the message to its subscribers "
            "(this member's own publishes).",
        )
        yield histogram(
            timings.ack, "migratory_publish_ack_seconds",
            "From reading a client's publish to queueing its PUBLISH_OK.",
        )
        yield histogram(source.batch_sizes.buckets(), "migratory_write_batch_frames",
                        "Frames written to a client in one socket write.")
        yield from heartbeat_families(stats.get("heartbeats"))
        cluster = source.cluster_metrics()
        if cluster is not None:
            yield from cluster_families(cluster)


def histogram(buckets: Buckets, name: str, documentation: str) -> HistogramMetricFamily:
    """The histogram of :mod:`.metric_buckets`' counts (cumulative, as Prometheus' ``le``)."""
    cumulative = 0
    counts: list[tuple[str, float]] = []
    for bound, count in zip(buckets.bounds, buckets.counts, strict=False):
        cumulative += count
        counts.append((repr(float(bound)), cumulative))
    counts.append(("+Inf", cumulative + buckets.counts[-1]))
    return HistogramMetricFamily(name, documentation, buckets=counts, sum_value=buckets.sum)


def _gauge(name: str, documentation: str, value: float) -> GaugeMetricFamily:
    return GaugeMetricFamily(name, documentation, value=value)


def _plain(stats: dict[str, Any]) -> Iterator[Metric]:
    for key, name, kind, doc in METRICS:
        value = stats.get(key)
        if not isinstance(value, int) or isinstance(value, bool):
            continue
        if kind == "counter":
            yield CounterMetricFamily(name, doc, value=value)
        else:
            yield GaugeMetricFamily(name, doc, value=value)


def _labelled(stats: dict[str, Any]) -> Iterator[Metric]:
    for key, name, label, doc in LABELLED_COUNTERS:
        counts = stats.get(key)
        family = CounterMetricFamily(name, doc, labels=[label])
        if isinstance(counts, dict):
            for value, count in sorted(counts.items()):
                family.add_metric([str(value)], count)
        yield family


# HeartbeatStatistics key -> (metric name, type, help) (migratory/server/heartbeats.py)
HEARTBEAT_METRICS: tuple[tuple[str, str, str, str], ...] = (
    ("sessions", "migratory_heartbeat_sessions", "gauge",
     "Native sessions granted a heartbeat and watched now."),
    ("sent", "migratory_heartbeats_sent", "counter",
     "Heartbeats (a pong without id) queued to idle sessions."),
    ("looks", "migratory_heartbeat_looks", "counter",
     "Sessions the heartbeat sweep looked at (twice per interval each)."),
    ("looks_late", "migratory_heartbeat_looks_late", "counter",
     "Looks made a tick or more after they were due: the sweep was at its limit "
     "(SWEEP_LIMIT a tick) and left them to the next ticks."),
    ("overdue", "migratory_heartbeat_sessions_overdue", "gauge",
     "Sessions due for a look that the sweep has not reached yet."),
    ("lag_seconds", "migratory_heartbeat_sweep_lag_seconds", "gauge",
     "How long the oldest overdue session has been due (0: the sweep is on time)."),
)


def heartbeat_families(figures: Any) -> Iterator[Metric]:
    """The heartbeats' figures (``/stats`` ``heartbeats``); nothing when heartbeats are
    not kept by this server."""
    if not isinstance(figures, dict):
        return
    for key, name, kind, doc in HEARTBEAT_METRICS:
        value = figures[key]
        if kind == "counter":
            yield CounterMetricFamily(name, doc, value=value)
        else:
            yield GaugeMetricFamily(name, doc, value=value)


def cluster_families(cluster: ClusterMetrics) -> Iterator[Metric]:
    role = GaugeMetricFamily(
        "migratory_cluster_role", "1 for this member's role in the cluster.", labels=["role"]
    )
    role.add_metric([cluster.role], 1)
    yield role
    if cluster.applied_clsn is not None:
        yield _gauge("migratory_cluster_applied_clsn",
                     "Committed batches this member has applied to its caches.",
                     cluster.applied_clsn)
    if cluster.raft_state is not None:
        state = GaugeMetricFamily(
            "migratory_raft_state", "1 for this seed's Raft state.", labels=["state"]
        )
        for name in ("leader", "follower", "candidate", "starting"):
            state.add_metric([name], int(cluster.raft_state == name))
        yield state
    for attr, name, doc in (
        ("raft_term", "migratory_raft_term", "This seed's current Raft term."),
        ("raft_commit_index", "migratory_raft_commit_index", "Raft log index known committed."),
        ("raft_last_applied", "migratory_raft_last_applied", "Raft log index applied here."),
        ("raft_subjects", "migratory_raft_subjects",
         "Subjects the seeds' replicated numbering holds: every subject ever published."),
        ("raft_snapshots", "migratory_raft_snapshots",
         "Retained snapshots the seeds' replicated caches hold (kept for ever)."),
    ):
        value = getattr(cluster, attr)
        if value is not None:
            yield _gauge(name, doc, value)
    if cluster.raft_dump_failures is not None:
        yield CounterMetricFamily(
            "migratory_raft_dump_failures",
            "Raft dumps (log compactions) that failed not for the disk: a bug; the log "
            "grows uncompacted meanwhile.", value=cluster.raft_dump_failures,
        )
    if cluster.raft_slow_syncs is not None:
        yield CounterMetricFamily(
            "migratory_raft_slow_syncs",
            "Syncs of this seed's Raft files (journal, term and vote, dump) that took "
            "0.1 s or more: a slow disk; the Raft thread waits in each.",
            value=cluster.raft_slow_syncs,
        )
    if cluster.raft_sync_waiting is not None:
        yield _gauge("migratory_raft_sync_waiting_seconds",
                     "How long the sync of a Raft file under way has waited (0: none is); "
                     "the seed's Raft neither answers nor sends meanwhile.",
                     cluster.raft_sync_waiting)
    for name, doc, label, counts in (
        ("migratory_cluster_link_refused",
         "Connections to the cluster link port refused before their handshake was done, "
         "by limit (MAX_PENDING_HANDSHAKES, LINK_CONNECTIONS_PER_SECOND, "
         "LINK_HANDSHAKES_PER_SECOND).", "limit", cluster.link_refusals),
        ("migratory_cluster_link_violations",
         "Authenticated cluster links this member closed because the peer broke a rule "
         "of the link, by rule (frame_size, frame_stall, links, origin, replicate, "
         "sync_request).", "rule", cluster.link_violations),
        ("migratory_raft_front_refused",
         "Connections to this seed's Raft port refused, by reason (stale: a seed's "
         "clock more than 120 s off this one's; replayed, bad_mac, not_a_preamble, "
         "timed_out, evicted).", "reason", cluster.raft_front_refused),
        ("migratory_cluster_link_publishes_refused",
         "Publishes of peer members (a forward to a seed, a Standard member's publish) "
         "refused by the check a client's publish passes, by status (PUBLISH_FAILED: "
         "invalid subject; MESSAGE_SIZE_LIMIT_EXCEEDED: past MaxMessageSize).", "status",
         cluster.link_publishes_refused),
    ):
        if counts:
            family = CounterMetricFamily(name, doc, labels=[label])
            for value, count in counts:
                family.add_metric([value], count)
            yield family
    if cluster.raft_front_skew is not None:
        yield _gauge("migratory_raft_front_skew_seconds", "Seconds the clock of the last "
                     "seed that proved the password on this seed's Raft port is ahead of "
                     "this one's (past +-120 s its connections are refused).",
                     cluster.raft_front_skew)
    if cluster.commit_latency is not None:
        yield histogram(
            cluster.commit_latency, "migratory_raft_commit_seconds",
            "From submitting a Raft command of this seed's publishes to its commit.",
        )
    up = GaugeMetricFamily("migratory_cluster_link_up", "1 when the link to a peer is up.",
                           labels=["peer", "kind"])
    lag = GaugeMetricFamily("migratory_cluster_link_lag",
                            "Committed batches (clsn) the far side of a link is behind.",
                            labels=["peer", "kind"])
    for link in cluster.links:
        up.add_metric([link.peer, link.kind], int(link.up))
        if link.lag is not None:
            lag.add_metric([link.peer, link.kind], link.lag)
    yield up
    yield lag


def registry_for(source: MetricsSource) -> CollectorRegistry:
    """A registry of its own (not the process-wide default) holding the server's collector."""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(ServerCollector(source))
    return registry


def render(registry: CollectorRegistry) -> bytes:
    return generate_latest(registry)

