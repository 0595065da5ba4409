"""``GET /metrics`` is valid Prometheus text and counts what the server did."""

from __future__ import annotations

import urllib.request
from typing import Any

from prometheus_client.parser import text_string_to_metric_families

from migratory.server import metrics


def scrape(url: str) -> dict[str, float]:
    with urllib.request.urlopen(f"{url}/metrics", timeout=5) as reply:
        assert reply.headers["Content-Type"] == metrics.CONTENT_TYPE
        text = reply.read().decode()
    return {
        sample.name: sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
    }


def test_metrics_are_prometheus_text_with_the_connection_gauge(start_server: Any) -> None:
    server = start_server()
    http = server.url.replace("ws://", "http://")
    first = scrape(http)
    assert first["migratory_ready"] == 1
    assert first["migratory_connections_open"] == 1  # the scrape itself
    second = scrape(http)
    assert second["migratory_connections_accepted_total"] == first[
        "migratory_connections_accepted_total"
    ] + 1


def test_render_skips_what_is_not_a_number() -> None:
    text = metrics.render({"connections_open": 3, "subjects": "x"}, ready=False).decode()
    families = {f.name: f for f in text_string_to_metric_families(text)}
    assert families["migratory_ready"].samples[0].value == 0
    assert families["migratory_connections_open"].samples[0].value == 3
    assert "migratory_subjects" not in families
