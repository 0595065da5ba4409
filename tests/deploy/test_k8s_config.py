"""Every pod of the StatefulSet gets a config the server accepts, layered as the server
layers it (the ConfigMap file, then the pod's environment), and a real member process
started exactly as a pod starts does not exit."""

from __future__ import annotations

import copy
import dataclasses
import secrets
import sys
from pathlib import Path
from typing import Any

import pytest
from k8s_manifests import (
    MONITOR_PORT,
    documents,
    find,
    generated_secrets,
    load_pod_config,
    pod_view,
)
from pod_sandbox import PodProcess

DOCS = documents()
PASSWORD = generated_secrets(secrets.token_urlsafe(24))


def max_replicas() -> int:
    return int(find(DOCS, "HorizontalPodAutoscaler")["spec"]["maxReplicas"])


def config_path(command: tuple[str, ...]) -> str:
    return command[command.index("--config") + 1]


@pytest.mark.parametrize("ordinal", range(max_replicas()))
def test_every_pod_gets_a_valid_config(ordinal: int, tmp_path: Path) -> None:
    config = load_pod_config(pod_view(DOCS, ordinal, PASSWORD), tmp_path)
    assert config.cluster_tls_certificate  # the links' mutual TLS, from the Secret
    assert config.server_name == f"migratory-{ordinal}"
    assert config.member_index == ordinal
    assert config.is_seed == (ordinal < 3)
    assert len(config.cluster_members) == max_replicas()


def test_every_per_address_limit_is_off_behind_the_service(tmp_path: Path) -> None:
    """Clients reach a pod through the Service's SNAT or an ingress: many share one source
    address, so a per-address limit would throttle them together (a member's clients
    failing over at once through one ingress address). Every such limit the server has,
    found by name, is off in the pod's config."""
    config = load_pod_config(pod_view(DOCS, 0, PASSWORD), tmp_path)
    names = [f.name for f in dataclasses.fields(config)]
    limits = [n for n in names if n.startswith("max_") and "per_address" in n]
    assert len(limits) >= 3, limits
    assert {name: getattr(config, name) for name in limits} == dict.fromkeys(limits, 0)


def test_env_overrides_use_keys_the_server_knows(tmp_path: Path) -> None:
    view = pod_view(DOCS, 0, PASSWORD)
    assert any(name.startswith("MIGRATORY_CFG_") for name in view.env)
    from migratory.config import env_overrides

    env_overrides(view.env)  # raises on an unknown key


def test_cluster_data_dir_is_a_persistent_volume_of_each_pod(tmp_path: Path) -> None:
    data_dir = load_pod_config(pod_view(DOCS, 0, PASSWORD), tmp_path).cluster_data_dir
    assert data_dir in pod_view(DOCS, 0, PASSWORD).data_mounts, "ClusterDataDir is not a claim"


def test_a_pod_started_as_the_manifest_says_serves_and_waits_for_its_peers(
    tmp_path: Path,
) -> None:
    """The ConfigMap file at its mount path, the pod's environment, the pod's command, in
    the pod's own network namespace with its hostname: the member starts, answers
    /healthz, and stays not ready (a lone seed has no Raft majority) without exiting."""
    view = pod_view(DOCS, 0, PASSWORD)
    hosts = f"127.0.0.1 localhost\n127.0.0.1 {view.name}.{view.subdomain} {view.name}\n"
    pod = PodProcess(view, pod_dir=tmp_path / view.name, bin_dir=Path(sys.executable).parent,
                     hosts=hosts)
    try:
        pod.wait_http("/healthz", 200, timeout=30)
        reason = pod.wait_http("/readyz", 503, timeout=10)
        assert reason.strip()
        status = pod.http_json("/cluster", MONITOR_PORT)
        assert status["role"] == "seed", status
        assert pod.proc.poll() is None, pod.log()
        assert "configuration error" not in pod.log()
    finally:
        code = pod.stop()
    assert code == 0, pod.log()
    assert "Traceback" not in pod.log()


def renamed_members(docs: list[dict[str, Any]], new: str) -> list[dict[str, Any]]:
    """The install with ClusterMemberTemplate changed in the ConfigMap alone."""
    docs = copy.deepcopy(docs)
    config_map = next(d for d in docs if d["kind"] == "ConfigMap")
    text = config_map["data"]["migratory.conf"]
    short = "migratory-{ordinal}.migratory-members:9800"
    assert f"ClusterMemberTemplate = {short}\n" in text
    config_map["data"]["migratory.conf"] = text.replace(short, new)
    return docs


@pytest.mark.parametrize("ordinal", [0, 2, 7])
def test_a_pods_address_is_its_ordinal_in_the_member_template(
    ordinal: int, tmp_path: Path
) -> None:
    """One source for a pod's cluster address: ClusterMemberTemplate (the ConfigMap) for
    the pod's ordinal (its pod-index label). Before, statefulset.yaml spelt the address a
    second time (ClusterMemberListen = $(POD_NAME).migratory-members:9800), and renaming
    the members in the ConfigMap alone (fully qualified names, another service or port)
    left every pod out of its own list: each crash-looped at start. Now the address
    follows the template; a rename is then a list the old pods refuse at link time
    (README, Scaling), not a pod that cannot start."""
    fqdn = "migratory-{ordinal}.migratory-members.default.svc.cluster.local:9800"
    view = pod_view(renamed_members(DOCS, fqdn), ordinal, PASSWORD)
    assert not any("CLUSTERMEMBERLISTEN" in name for name in view.env), view.env
    config = load_pod_config(view, tmp_path)
    assert config.cluster_member_listen == (
        f"migratory-{ordinal}.migratory-members.default.svc.cluster.local", 9800)
    assert config.member_index == ordinal


def test_a_pod_beyond_the_member_list_stops_naming_both_keys(tmp_path: Path) -> None:
    """A pod whose ordinal the list does not reach (``kubectl scale`` past the HPA's
    maxReplicas, or a ClusterMemberCount set by hand below it) must stop at start with
    a line naming the ordinal and the count -- not serve under an address no other
    member lists. Its pod-index label is the one fact it is given."""
    from migratory.config import ConfigError

    ordinal = max_replicas()
    with pytest.raises(ConfigError) as refused:
        load_pod_config(pod_view(DOCS, ordinal, PASSWORD), tmp_path)
    assert (f"ClusterMemberOrdinal (from environment variable MIGRATORY_CFG_CLUSTERMEMBERORDINAL)"
            f" = {ordinal} is past the member list: ClusterMemberCount (from environment "
            f"variable MIGRATORY_CFG_CLUSTERMEMBERCOUNT) = {ordinal}") in str(refused.value)


CFS_PERIOD_MS = 100
"""The kernel's CFS bandwidth period (``cpu.cfs_period_us``, 100,000 by default): a pod
over its CPU limit is stopped until the next one."""


def test_a_seed_pod_stopped_by_its_cpu_limit_does_not_depose_its_leader(
    tmp_path: Path,
) -> None:
    """A pod over its CPU limit stops for up to the rest of each CFS period: the seeds'
    shortest election timeout must span three periods. Seeds frozen 95 ms of every 100
    elected 14-18 times a minute at the default 150 ms and never at 300
    (benchmarks/cluster_spurious_elections.py --load throttle, docs/benchmarks.md)."""
    from migratory.config_cluster import DEFAULT_ELECTION_TIMEOUT_MS

    limits = find(DOCS, "StatefulSet")["spec"]["template"]["spec"]["containers"][0][
        "resources"]["limits"]
    assert "cpu" in limits  # the pods run under a CPU limit: the case this is about
    config = load_pod_config(pod_view(DOCS, 0, PASSWORD), tmp_path)
    assert config.cluster_election_timeout >= 3 * CFS_PERIOD_MS > DEFAULT_ELECTION_TIMEOUT_MS
