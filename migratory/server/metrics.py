"""``GET /metrics``: the server's counters in the Prometheus text format (0.0.4).

``migratory_connections_open`` is what the HPA's custom metric scales on
(deploy/k8s/prometheus-adapter-rule.yaml turns it into ``migratory_connections``).
"""

from __future__ import annotations

from typing import Any

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"

# statistics key -> (metric name, type, help)
METRICS: tuple[tuple[str, str, str, str], ...] = (
    ("connections_open", "migratory_connections_open", "gauge",
     "Client connections open now (WebSocket and HTTP)."),
    ("subjects", "migratory_subjects", "gauge", "Subjects with a cache or a snapshot."),
    ("subscriptions", "migratory_subscriptions", "gauge", "Live subscriptions."),
    ("connections_accepted", "migratory_connections_accepted_total", "counter",
     "Connections accepted."),
    ("sessions_opened", "migratory_sessions_opened_total", "counter",
     "Clients that completed `connect`."),
    ("publishes_received", "migratory_publishes_received_total", "counter",
     "Publish operations received from clients."),
    ("publishes_refused", "migratory_publishes_refused_total", "counter",
     "Publishes refused before they were submitted (invalid, too large, denied)."),
    ("messages_published", "migratory_messages_published_total", "counter",
     "Messages numbered into this member's caches."),
    ("frames_fanned_out", "migratory_deliveries_total", "counter",
     "Messages delivered to subscribers."),
    ("slow_consumers", "migratory_slow_consumers_total", "counter",
     "Clients cut off for reading too slowly."),
    ("protocol_errors", "migratory_protocol_errors_total", "counter",
     "Clients closed for breaking the protocol."),
    ("mqtt_sessions_opened", "migratory_mqtt_sessions_opened_total", "counter",
     "MQTT clients whose CONNECT was accepted."),
    ("mqtt_sessions_resumed", "migratory_mqtt_sessions_resumed_total", "counter",
     "MQTT persistent sessions (clean session 0) taken up again."),
    ("mqtt_protocol_errors", "migratory_mqtt_protocol_errors_total", "counter",
     "MQTT connections closed for a malformed packet."),
    ("mqtt_resyncs", "migratory_mqtt_resyncs_total", "counter",
     "Resumed MQTT subjects the cache no longer reached (the snapshot was sent)."),
    ("mqtt_wills_published", "migratory_mqtt_wills_published_total", "counter",
     "MQTT will messages published."),
    ("bytes_written", "migratory_bytes_written_total", "counter", "Bytes written to clients."),
    ("writes", "migratory_socket_writes_total", "counter", "Socket writes to clients."),
)


def render(statistics: dict[str, Any], *, ready: bool) -> bytes:
    lines = [
        "# HELP migratory_ready 1 when the member accepts clients (as /readyz).",
        "# TYPE migratory_ready gauge",
        f"migratory_ready {int(ready)}",
    ]
    for key, name, kind, doc in METRICS:
        value = statistics.get(key)
        if not isinstance(value, int):
            continue
        lines += [f"# HELP {name} {doc}", f"# TYPE {name} {kind}", f"{name} {value}"]
    return ("\n".join(lines) + "\n").encode()
