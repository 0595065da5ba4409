"""Monitoring of a real Guaranteed cluster (3 seeds + 1 non-seed): Raft and link metrics
on every member's /metrics, and the meta-subjects of every member reaching a monitoring
client connected to any one of them (pushed through the committed stream)."""

from __future__ import annotations

import json
import sys
import time
import urllib.request
from pathlib import Path
from typing import Any

import pytest
from cluster_fixture import LocalCluster
from prometheus_client.parser import text_string_to_metric_families

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "server"))
from rawclient import RawClient

from migratory.protocol import ops
from migratory.server.meta_subjects import CLUSTER_SUBJECT, stats_subject

TOKEN = "monitoring-token"


@pytest.fixture
def cluster4(tmp_path: Path) -> Any:
    cluster = LocalCluster(tmp_path, members=4, seeds=3, MonitorToken=TOKEN,
                           MonitorPushInterval="1")
    cluster.start_all()
    try:
        cluster.wait_ready()
        yield cluster
    finally:
        cluster.stop()


def samples(cluster: LocalCluster, index: int) -> dict[tuple[str, tuple[Any, ...]], float]:
    with urllib.request.urlopen(f"{cluster.http(index)}/metrics", timeout=5) as reply:
        text = reply.read().decode()
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


def test_raft_and_link_metrics_and_pushed_cluster_views(cluster4: LocalCluster) -> None:
    members = [cluster4.settings[i]["ClusterMemberListen"] for i in range(4)]
    deadline = time.monotonic() + 20
    while True:  # Raft links come up a moment after readiness
        scraped = [samples(cluster4, i) for i in range(4)]
        raft_up = [
            sum(v for (name, labels), v in s.items()
                if name == "migratory_cluster_link_up" and ("kind", "raft") in labels)
            for s in scraped[:3]
        ]
        if raft_up == [2, 2, 2] or time.monotonic() > deadline:
            break
        time.sleep(0.2)
    assert raft_up == [2, 2, 2]  # every seed linked to the two others
    leaders = [s.get(("migratory_raft_state", (("state", "leader"),)), 0) for s in scraped[:3]]
    assert sorted(leaders) == [0, 0, 1]
    terms = {s[("migratory_raft_term", ())] for s in scraped[:3]}
    assert len(terms) == 1 and terms.pop() >= 1
    assert all(s[("migratory_raft_commit_index", ())] >= 1 for s in scraped[:3])
    # the subjects the seeds number for ever (cluster/subject_count.py): a gauge per seed
    assert all(s[("migratory_raft_subjects", ())] >= 0 for s in scraped[:3])
    assert all(("migratory_raft_snapshots", ()) in s for s in scraped[:3])
    for seed, is_leader in zip(scraped[:3], leaders, strict=True):
        raft_lag = [v for (name, labels), v in seed.items()
                    if name == "migratory_cluster_link_lag" and ("kind", "raft") in labels]
        # a follower reports how far it is behind on its link to the leader; the leader none
        assert len(raft_lag) == (0 if is_leader else 1) and all(v >= 0 for v in raft_lag)
    assert scraped[3].get(("migratory_cluster_role", (("role", "non-seed"),))) == 1
    assert ("migratory_raft_term", ()) not in scraped[3]
    assert ("migratory_raft_subjects", ()) not in scraped[3]
    upstream = [(labels, v) for (name, labels), v in scraped[3].items()
                if name == "migratory_cluster_link_up" and ("kind", "upstream") in labels]
    assert len(upstream) == 1 and upstream[0][1] == 1

    # a monitoring client on the non-seed hears every member's view and stats
    dashboard = RawClient(cluster4.port(3), timeout=10)
    dashboard.connect("dashboard", token=TOKEN)
    dashboard.subscribe(CLUSTER_SUBJECT)
    dashboard.subscribe(stats_subject(members[0]))
    views: dict[str, dict[str, Any]] = {}
    stats_seen = False
    deadline = time.monotonic() + 30
    while (len(views) < 4 or not stats_seen) and time.monotonic() < deadline:
        op = dashboard.recv_op(timeout=max(deadline - time.monotonic(), 0.1))
        if not isinstance(op, ops.Deliver):
            continue
        for message in op.messages:
            body = json.loads(message.content)
            if message.subject == CLUSTER_SUBJECT:
                assert body["kind"] == "cluster" and body["member"] == body["status"]["member"]
                views[body["member"]] = body["status"]
            else:
                assert body["kind"] == "stats" and body["member"] == members[0]
                stats_seen = True
    assert sorted(views) == sorted(members)
    assert stats_seen
    assert sum(view.get("raft_state") == "leader" for view in views.values()) >= 1
    # and the push is denied to a client without the token, on any member
    outsider = RawClient(cluster4.port(0))
    outsider.connect("outsider")
    outsider.subscribe(CLUSTER_SUBJECT)
    deny = outsider.recv_op()
    assert isinstance(deny, ops.SubjectStatus) and deny.status is ops.Status.SUBSCRIBE_DENY
