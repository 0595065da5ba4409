"""Every pod of the StatefulSet gets a config the server accepts, layered as the server
layers it (the ConfigMap file, then the pod's environment), and a real member process
started exactly as a pod starts does not exit."""

from __future__ import annotations

import copy
import dataclasses
import secrets
import sys
from pathlib import Path

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


def test_a_member_template_renamed_in_the_configmap_alone_stops_the_rolled_pod(
    tmp_path: Path,
) -> None:
    """Each pod's own address (ClusterMemberListen) comes from statefulset.yaml, the list
    from the ConfigMap's ClusterMemberTemplate: renaming the members in the ConfigMap
    alone (fully qualified names, another service, another port) leaves the first pod
    rolled out of its own list. It must stop at start naming both keys -- the rollout
    stalls on a crash-looping pod whose log says why (deploy/k8s/README.md, Scaling) --
    not serve under an address the others do not list."""
    from migratory.config import ConfigError

    docs = copy.deepcopy(DOCS)
    config_map = next(d for d in docs if d["kind"] == "ConfigMap")
    text = config_map["data"]["migratory.conf"]
    short = "migratory-{ordinal}.migratory-members:9800"
    assert short in text
    config_map["data"]["migratory.conf"] = text.replace(
        short, "migratory-{ordinal}.migratory-members.default.svc.cluster.local:9800")
    with pytest.raises(ConfigError) as refused:
        load_pod_config(pod_view(docs, 2, PASSWORD), tmp_path)
    assert "ClusterMemberListen (from environment) migratory-2.migratory-members:9800 is " \
        "not one of ClusterMembers (ClusterMemberTemplate" in str(refused.value)
