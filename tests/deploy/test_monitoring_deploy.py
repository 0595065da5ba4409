"""deploy/monitoring (Grafana dashboard, Prometheus scrape config) and the Kubernetes
monitoring wiring: the dashboard passes a JSON Schema check and only queries metrics
the server exports; the scrape targets are the monitoring listener's port."""

from __future__ import annotations

import copy
import json
import re
from pathlib import Path
from typing import Any

import jsonschema
import pytest
import yaml
from k8s_manifests import (
    K8S_DIR,
    MONITOR_PORT,
    ROOT,
    documents,
    find,
    generated_secrets,
    load_pod_config,
    pod_view,
)

from migratory.server import metric_buckets, metric_figures, metrics

MONITORING = ROOT / "deploy" / "monitoring"
DASHBOARD = json.loads((MONITORING / "grafana-dashboard.json").read_text())

_DATASOURCE = {
    "type": "object",
    "required": ["type", "uid"],
    "properties": {"type": {"const": "prometheus"}, "uid": {"type": "string"}},
}
_GRID = {
    "type": "object",
    "required": ["h", "w", "x", "y"],
    "properties": {
        "h": {"type": "integer", "minimum": 1},
        "w": {"type": "integer", "minimum": 1, "maximum": 24},
        "x": {"type": "integer", "minimum": 0, "maximum": 23},
        "y": {"type": "integer", "minimum": 0},
    },
    "additionalProperties": False,
}
# The part of Grafana's dashboard model (schemaVersion 39) this dashboard uses.
DASHBOARD_SCHEMA: dict[str, Any] = {
    "$schema": "https://json-schema.org/draft/2020-12/schema",
    "type": "object",
    "required": ["title", "uid", "schemaVersion", "panels", "templating", "time"],
    "properties": {
        "title": {"type": "string", "minLength": 1},
        "uid": {"type": "string", "pattern": "^[A-Za-z0-9_-]{1,40}$"},
        "schemaVersion": {"type": "integer", "minimum": 36},
        "refresh": {"type": "string"},
        "time": {
            "type": "object",
            "required": ["from", "to"],
            "properties": {"from": {"type": "string"}, "to": {"type": "string"}},
        },
        "templating": {
            "type": "object",
            "required": ["list"],
            "properties": {"list": {"type": "array", "items": {
                "type": "object",
                "required": ["name", "type"],
                "properties": {"type": {"enum": ["datasource", "query", "custom", "interval"]}},
            }}},
        },
        "panels": {"type": "array", "minItems": 1, "items": {
            "type": "object",
            "required": ["id", "type", "title", "gridPos"],
            "properties": {
                "id": {"type": "integer", "minimum": 1},
                "type": {"enum": ["row", "timeseries", "stat", "gauge", "table"]},
                "title": {"type": "string", "minLength": 1},
                "gridPos": _GRID,
                "datasource": _DATASOURCE,
                "targets": {"type": "array", "minItems": 1, "items": {
                    "type": "object",
                    "required": ["refId", "expr"],
                    "properties": {
                        "refId": {"type": "string", "pattern": "^[A-Z]$"},
                        "expr": {"type": "string", "minLength": 1},
                        "legendFormat": {"type": "string"},
                        "datasource": _DATASOURCE,
                    },
                }},
            },
            "if": {"properties": {"type": {"const": "timeseries"}}},
            "then": {"required": ["datasource", "targets"]},
        }},
    },
}


def check(dashboard: dict[str, Any]) -> None:
    jsonschema.Draft202012Validator(DASHBOARD_SCHEMA).validate(dashboard)
    ids = [panel["id"] for panel in dashboard["panels"]]
    assert len(ids) == len(set(ids)), "panel ids must be unique"
    cells: set[tuple[int, int]] = set()
    for panel in dashboard["panels"]:
        grid = panel["gridPos"]
        assert grid["x"] + grid["w"] <= 24, panel["title"]
        area = {(x, y) for x in range(grid["x"], grid["x"] + grid["w"])
                for y in range(grid["y"], grid["y"] + grid["h"])}
        assert not area & cells, f"{panel['title']!r} overlaps another panel"
        cells |= area


def test_the_dashboard_passes_the_schema_check() -> None:
    jsonschema.Draft202012Validator.check_schema(DASHBOARD_SCHEMA)
    check(DASHBOARD)


@pytest.mark.parametrize("plant", ["no_grid", "no_expr", "bad_type", "overlap", "dup_id"])
def test_the_schema_check_catches_a_broken_dashboard(plant: str) -> None:
    broken = copy.deepcopy(DASHBOARD)
    panels = [p for p in broken["panels"] if p["type"] == "timeseries"]
    if plant == "no_grid":
        del panels[0]["gridPos"]
    elif plant == "no_expr":
        del panels[0]["targets"][0]["expr"]
    elif plant == "bad_type":
        panels[0]["type"] = "graphh"
    elif plant == "overlap":
        panels[1]["gridPos"] = dict(panels[0]["gridPos"])
    else:
        panels[1]["id"] = panels[0]["id"]
    with pytest.raises((jsonschema.ValidationError, AssertionError)):
        check(broken)


class _Source:
    """Every family the server can export, a cluster member's included."""

    def __init__(self) -> None:
        self.timings = metric_figures.PublishTimings()
        self.batch_sizes = metric_buckets.BatchSizes()

    def statistics(self) -> dict[str, Any]:
        stats: dict[str, Any] = {key: 1 for key, _, _, _ in metrics.METRICS}
        stats.update({key: {"x": 1} for key, _, _, _ in metrics.LABELLED_COUNTERS})
        stats["heartbeats"] = {key: 1 for key, _, _, _ in metrics.HEARTBEAT_METRICS}
        return stats

    def ready(self) -> bool:
        return True

    def frontends(self) -> tuple[dict[str, int], int, int]:
        return {"websocket": 1}, 0, 0

    def cluster_metrics(self) -> metric_figures.ClusterMetrics:
        return metric_figures.ClusterMetrics(
            member="m", role="seed", raft_state="leader", raft_term=1, raft_commit_index=1,
            raft_last_applied=1, applied_clsn=1,
            links=(metric_figures.PeerLink("p", "raft", True, 0),),
            commit_latency=metric_buckets.Buckets(metric_buckets.LATENCY_BOUNDS),
            link_refusals=(("LINK_CONNECTIONS_PER_SECOND", 1),),
            link_violations=(("frame_size", 0),),
            link_publishes_refused=(("PUBLISH_FAILED", 0),),
            raft_dump_failures=0, raft_subjects=1, raft_snapshots=1,
            raft_front_refused=(("stale", 0),), raft_front_skew=0.0, raft_slow_syncs=0,
            raft_sync_waiting=0.0,
        )


def exported_sample_names() -> set[str]:
    from prometheus_client.parser import text_string_to_metric_families

    text = metrics.render(metrics.registry_for(_Source())).decode()
    return {s.name for f in text_string_to_metric_families(text) for s in f.samples}


def test_the_dashboard_queries_only_metrics_the_server_exports() -> None:
    exported = exported_sample_names()
    queried = {
        name
        for panel in DASHBOARD["panels"]
        for target in panel.get("targets", [])
        for name in re.findall(r"\bmigratory_[a-z_]+", target["expr"])
    }
    queried |= set(re.findall(r"\bmigratory_[a-z_]+", json.dumps(DASHBOARD["templating"])))
    assert queried, "the dashboard queries nothing"
    assert queried <= exported, sorted(queried - exported)


def test_prometheus_scrapes_the_monitoring_listener() -> None:
    config = yaml.safe_load((MONITORING / "prometheus.yml").read_text())
    jobs = {job["job_name"]: job for job in config["scrape_configs"]}
    static = jobs["migratory"]
    assert static["metrics_path"] == "/metrics"
    (targets,) = static["static_configs"]
    assert all(t.endswith(f":{MONITOR_PORT}") for t in targets["targets"])
    pods = jobs["migratory-kubernetes-pods"]
    for rule in pods["relabel_configs"]:
        if "regex" in rule:
            re.compile(rule["regex"])
    keeps = [r for r in pods["relabel_configs"] if r.get("action") == "keep"]
    assert any("prometheus_io_scrape" in r["source_labels"][0] for r in keeps)


def test_kubernetes_scrapes_the_monitoring_port_of_every_member(tmp_path: Path) -> None:
    docs = documents()
    sts = find(docs, "StatefulSet")
    template = sts["spec"]["template"]
    (container,) = template["spec"]["containers"]
    ports = {p["name"]: p["containerPort"] for p in container["ports"]}
    assert ports["monitor"] == MONITOR_PORT
    assert template["metadata"]["annotations"]["prometheus.io/port"] == str(MONITOR_PORT)
    config = load_pod_config(pod_view(docs, 0, generated_secrets("x")), tmp_path)
    assert config.monitor_listen == ("0.0.0.0", MONITOR_PORT)
    members = find(docs, "Service", "migratory-members")
    (monitor,) = [p for p in members["spec"]["ports"] if p["name"] == "monitor"]
    assert monitor["targetPort"] == "monitor"
    service_monitor = yaml.safe_load((K8S_DIR / "servicemonitor.yaml").read_text())
    assert service_monitor["kind"] == "ServiceMonitor"
    wanted = service_monitor["spec"]["selector"]["matchLabels"]
    assert wanted.items() <= members["metadata"]["labels"].items()
    client = find(docs, "Service", "migratory")
    assert not wanted.items() <= client["metadata"].get("labels", {}).items()
    (endpoint,) = service_monitor["spec"]["endpoints"]
    assert endpoint["port"] == "monitor" and endpoint["path"] == "/metrics"


def test_every_exported_metric_is_documented() -> None:
    from prometheus_client.parser import text_string_to_metric_families

    text = metrics.render(metrics.registry_for(_Source())).decode()
    families = {f.name for f in text_string_to_metric_families(text)}
    counters = {f.name for f in text_string_to_metric_families(text) if f.type == "counter"}
    doc = (ROOT / "docs" / "monitoring.md").read_text()
    missing = sorted(
        name for name in families
        if f"`{name}_total`" not in doc and f"`{name}`" not in doc
    )
    assert not missing, f"not in docs/monitoring.md: {missing}"
    assert all(f"`{name}_total`" in doc for name in counters)


NOT_METRICS = {"migratory_client", "migratory_term_query"}  # the SDK; a Raft link message


def test_every_metric_the_docs_name_is_exported() -> None:
    """The other way: a metric renamed or removed in the code leaves no row behind in
    docs/monitoring.md (nor a name in the other docs) that a dashboard would query in
    vain. Before, only the code's names were looked for in the doc, and the stand-in
    server above lacked the heartbeat and Raft-size families the doc lists."""
    exported = exported_sample_names()
    from prometheus_client.parser import text_string_to_metric_families

    text = metrics.render(metrics.registry_for(_Source())).decode()
    exported |= {f.name for f in text_string_to_metric_families(text)}
    named = {
        f"{path.name}: {name}"
        for path in (ROOT / "docs").glob("*.md")
        for name in re.findall(r"`(migratory_[a-z0-9_]+)", path.read_text())
        if name not in exported and name not in NOT_METRICS
    }
    assert not named, sorted(named)
