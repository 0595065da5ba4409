"""The install (``kubectl kustomize deploy/k8s``) is valid Kubernetes and has the shape
the MigratoryData Elasticity guide asks for, checked on the rendered resources."""

from __future__ import annotations

import copy
import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from k8s_manifests import (
    EXAMPLES,
    K8S_DIR,
    documents,
    find,
    generated_secrets,
    headless_service_names,
    load_pod_config,
    pod_view,
    rendered_text,
    running_replicas,
)

import cluster.raft as raft
from migratory.config import Config
from migratory.server import metrics

KUBERNETES_VERSIONS = ("1.30.0", "1.37.0")  # the oldest with preStop sleep, the newest
DOCS = documents()
PASSWORD = generated_secrets("from-the-generated-secret")


def validate(path: Path, version: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(Path(sys.executable).parent / "kubernetes-validate"), "--strict", "--quiet",
         "-k", version, str(path)],
        capture_output=True, text=True, timeout=120,
    )


@pytest.mark.parametrize("version", KUBERNETES_VERSIONS)
def test_every_manifest_is_valid_strictly(version: str, tmp_path: Path) -> None:
    rendered = tmp_path / "rendered.yaml"
    rendered.write_text(rendered_text())
    files = [rendered, *(K8S_DIR / name for name in EXAMPLES if name.startswith("ingress"))]
    for path in files:
        result = validate(path, version)
        assert result.returncode == 0, result.stdout + result.stderr


def test_strict_validation_catches_a_misspelt_field(tmp_path: Path) -> None:
    planted = tmp_path / "planted.yaml"
    planted.write_text(rendered_text().replace("publishNotReadyAddresses", "publishNotReady"))
    result = validate(planted, KUBERNETES_VERSIONS[-1])
    assert result.returncode != 0 and "publishNotReady" in result.stdout + result.stderr


def test_kustomization_installs_every_manifest_but_the_examples() -> None:
    kustomization = yaml.safe_load((K8S_DIR / "kustomization.yaml").read_text())
    listed = set(kustomization["resources"])
    on_disk = {p.name for p in K8S_DIR.glob("*.yaml")} - {
        "kustomization.yaml", *EXAMPLES, *kustomization.get("configurations", [])}
    assert listed == on_disk
    kinds = {d["kind"] for d in DOCS}
    assert {"StatefulSet", "Service", "HorizontalPodAutoscaler", "PodDisruptionBudget",
            "ConfigMap", "Job"} <= kinds


def test_no_password_is_written_in_the_repository() -> None:
    assert not [d for d in DOCS if d["kind"] == "Secret"], "a Secret with a literal value"
    job = find(DOCS, "Job")
    command = job["spec"]["template"]["spec"]["containers"][0]["command"]
    assert command[:3] == ["python", "-m", "migratory.kubernetes_secret"]
    made = command[command.index("--name") + 1], command[command.index("--key") + 1]
    refs = re.findall(r"secretKeyRef:\s+key: (\S+)\s+name: (\S+)(\s+optional: true)?",
                      rendered_text())
    required = {(name, key) for key, name, optional in refs if not optional}
    assert required == {made}  # a pod never waits for a Secret nobody creates
    # the only other one: the operator's optional monitoring token (push monitoring off
    # while it does not exist)
    assert {(n, k) for k, n, o in refs if o} == {("migratory-monitoring", "token")}


def test_statefulset_starts_all_pods_at_once_behind_a_headless_service() -> None:
    sts = find(DOCS, "StatefulSet")
    assert sts["spec"]["podManagementPolicy"] == "Parallel"
    members = find(DOCS, "Service", sts["spec"]["serviceName"])
    assert members["spec"]["clusterIP"] == "None"
    assert members["spec"]["publishNotReadyAddresses"] is True


def test_members_are_generated_from_the_hpa_maximum(tmp_path: Path) -> None:
    hpa = find(DOCS, "HorizontalPodAutoscaler")
    largest = hpa["spec"]["maxReplicas"]
    configs = [member_config(i, tmp_path) for i in range(largest)]
    expected = tuple((f"migratory-{i}.migratory-members", 9800) for i in range(largest))
    assert all(c.cluster_members == expected for c in configs)
    assert [c.member_index for c in configs] == list(range(largest))
    seeds = configs[0].cluster_seed_member_count
    assert [c.is_seed for c in configs] == [i < seeds for i in range(largest)]
    assert hpa["spec"]["minReplicas"] >= seeds


def test_the_hpa_alone_sets_the_number_of_pods() -> None:
    """``kubectl apply`` sets every field of the file that differs from the live object:
    a ``replicas`` in the StatefulSet would take a cluster the HPA scaled out back to that
    number at every config change or upgrade (Kubernetes' HPA documentation: remove
    ``spec.replicas`` from the manifest)."""
    assert "replicas" not in find(DOCS, "StatefulSet")["spec"]
    assert running_replicas(DOCS) == find(DOCS, "HorizontalPodAutoscaler")["spec"]["minReplicas"]


def member_config(ordinal: int, tmp_path: Path) -> Config:
    return load_pod_config(pod_view(DOCS, ordinal, PASSWORD), tmp_path / str(ordinal))


def test_hpa_scales_on_cpu_and_connections_per_pod() -> None:
    hpa = find(DOCS, "HorizontalPodAutoscaler")
    metric_names = {
        m["resource"]["name"] if m["type"] == "Resource" else m["pods"]["metric"]["name"]
        for m in hpa["spec"]["metrics"]
    }
    rule = yaml.safe_load((K8S_DIR / "prometheus-adapter-rule.yaml").read_text())
    custom = rule["rules"]["custom"][0]
    assert metric_names == {"cpu", custom["name"]["as"]}
    served = re.search(r"^\^(\w+)\$$", custom["name"]["matches"])
    assert served and served.group(1) in {name for _, name, _, _ in metrics.METRICS}
    assert served.group(1) in custom["seriesQuery"]


def test_pdb_keeps_a_majority_of_the_seeds(tmp_path: Path) -> None:
    seeds = member_config(0, tmp_path).cluster_seed_member_count
    pdb = find(DOCS, "PodDisruptionBudget")
    assert pdb["spec"]["minAvailable"] == seeds // 2 + 1
    (index,) = pdb["spec"]["selector"]["matchExpressions"]
    assert index["key"] == "apps.kubernetes.io/pod-index"
    assert index["values"] == [str(i) for i in range(seeds)]


COREDNS_CACHE_SECONDS = 30
"""The ``cache 30`` (and kubernetes plugin ``ttl 30``) of the usual CoreDNS Corefile: how
long a seed may still resolve a recreated seed's name to the pod's old IP."""


def test_a_rolling_update_waits_out_cluster_dns_before_the_next_seed() -> None:
    """Seeds dial each other by name (pysyncobj: the higher address dials the lower). A
    recreated seed that reaches the leader is ready, while a third seed that dials it may
    still get its old IP from the cluster DNS cache. Taking the next seed then (the
    leader, or the seed linked to it) leaves the two that cannot reach each other: no
    majority until the cache expires. The next seed leaves Raft no earlier than
    ``minReadySeconds`` plus its preStop sleep after the recreated one is ready; by then
    the cache, pysyncobj's own (``DNS_CACHE_SECONDS``) and an abandoned dial must be over."""
    spec = find(DOCS, "StatefulSet")["spec"]
    pre_stop = spec["template"]["spec"]["containers"][0]["lifecycle"]["preStop"]["sleep"]
    stale = COREDNS_CACHE_SECONDS + raft.DNS_CACHE_SECONDS + raft.RaftTimings().connection_timeout
    assert spec.get("minReadySeconds", 0) + pre_stop["seconds"] >= stale


def test_a_rolling_update_takes_one_pod_at_a_time() -> None:
    """The PDB does not gate a rolling update (it is not an eviction): only the
    StatefulSet's own ``maxUnavailable`` (default 1) keeps two seeds from going at once."""
    strategy = find(DOCS, "StatefulSet")["spec"]["updateStrategy"]
    assert strategy["type"] == "RollingUpdate"
    assert strategy.get("rollingUpdate", {}).get("maxUnavailable", 1) == 1


def test_member_names_are_the_pods_dns_names(tmp_path: Path) -> None:
    """Every member a pod dials is ``<pod>.<governing service>``: the StatefulSet's name
    and ``serviceName`` as rendered (a ``namePrefix`` or a rename must move both), and that
    Service is the headless one publishing not-ready pods."""
    sts = find(DOCS, "StatefulSet")
    service = find(DOCS, "Service", sts["spec"]["serviceName"])
    assert service["spec"]["clusterIP"] == "None"
    assert service["spec"]["publishNotReadyAddresses"] is True
    names = {port["name"]: port["port"] for port in service["spec"]["ports"]}
    config = member_config(0, tmp_path)
    hosts = [f"{sts['metadata']['name']}-{i}.{sts['spec']['serviceName']}" for i in
             range(len(config.cluster_members))]
    assert [host for host, _ in config.cluster_members] == hosts
    assert {port for _, port in config.cluster_members} == {names["cluster"]}
    assert names["raft"] == names["cluster"] + 1  # Raft on the cluster port + 1


def test_every_place_names_the_one_headless_service() -> None:
    """The members' headless service is named in four places; they must agree (the TLS
    host went unchecked: a renamed service kept a certificate for the old name)."""
    names = headless_service_names(DOCS)
    assert len(set(names.values())) == 1, names


def test_a_headless_service_renamed_in_one_place_is_caught() -> None:
    """The check above fails when the names disagree: the Service and the StatefulSet
    renamed (as ``namePrefix`` does), the ConfigMap and the Job left as they were."""
    docs = copy.deepcopy(DOCS)
    service = next(d for d in docs if d["kind"] == "Service"
                   and d["spec"].get("clusterIP") == "None")
    service["metadata"]["name"] = "peers"
    find(docs, "StatefulSet")["spec"]["serviceName"] = "peers"
    names = headless_service_names(docs)
    assert names["ConfigMap ClusterMemberTemplate"] == names["Job --tls-host"] != "peers"
    assert len(set(names.values())) == 2


def test_seeds_are_spread_over_nodes(tmp_path: Path) -> None:
    seeds = member_config(0, tmp_path).cluster_seed_member_count
    spec = find(DOCS, "StatefulSet")["spec"]["template"]["spec"]
    hard = [c for c in spec["topologySpreadConstraints"]
            if c["whenUnsatisfiable"] == "DoNotSchedule"]
    assert [c["topologyKey"] for c in hard] == ["kubernetes.io/hostname"]
    (index,) = hard[0]["labelSelector"]["matchExpressions"]
    assert index["values"] == [str(i) for i in range(seeds)]


def test_pods_run_locked_down_with_resources_and_probes() -> None:
    spec = find(DOCS, "StatefulSet")["spec"]["template"]["spec"]
    assert spec["securityContext"]["runAsNonRoot"] is True
    assert spec["securityContext"]["fsGroup"]
    (container,) = spec["containers"]
    security = container["securityContext"]
    assert security["readOnlyRootFilesystem"] is True
    assert security["allowPrivilegeEscalation"] is False
    assert security["capabilities"]["drop"] == ["ALL"]
    assert {"cpu", "memory"} <= set(container["resources"]["requests"])
    assert "memory" in container["resources"]["limits"]
    assert container["startupProbe"]["httpGet"]["path"] == "/healthz"
    assert container["livenessProbe"]["httpGet"]["path"] == "/healthz"
    assert container["readinessProbe"]["httpGet"]["path"] == "/readyz"
    startup = container["startupProbe"]
    assert startup["periodSeconds"] * startup["failureThreshold"] >= 300
    assert container["lifecycle"]["preStop"]
    annotations = find(DOCS, "StatefulSet")["spec"]["template"]["metadata"]["annotations"]
    assert annotations["prometheus.io/path"] == "/metrics"


def test_client_service_and_ingress_example_reach_the_client_port() -> None:
    client = find(DOCS, "Service", "migratory")
    (port,) = client["spec"]["ports"]
    assert port["targetPort"] == "ws"
    ingress = yaml.safe_load((K8S_DIR / "ingress-example.yaml").read_text())
    backend = ingress["spec"]["rules"][0]["http"]["paths"][0]["backend"]["service"]
    assert (backend["name"], backend["port"]["name"]) == ("migratory", port["name"])
    timeouts = [v for k, v in ingress["metadata"]["annotations"].items() if "timeout" in k]
    assert timeouts and all(int(v) >= 600 for v in timeouts)


def test_no_scale_deletes_a_seeds_raft_log() -> None:
    """The controller cannot tell a seed's claim from a non-seed's: with ``whenScaled:
    Delete`` a count set below the seeds (``kubectl scale --replicas=0``, an apply that
    drops a ``replicas`` field: 1) deleted the seeds' Raft logs with their pods
    (tests/deploy/scaling_faults.py ``scaled-below-the-seeds`` plays it: DATA_RESYNC,
    positions backwards, acknowledged publishes lost). Nor does ``kubectl delete``."""
    policy = find(DOCS, "StatefulSet")["spec"].get("persistentVolumeClaimRetentionPolicy", {})
    assert policy.get("whenScaled", "Retain") == "Retain", policy
    assert policy.get("whenDeleted", "Retain") == "Retain", policy


def test_the_drain_fits_in_the_termination_grace_period(tmp_path: Path) -> None:
    spec = find(DOCS, "StatefulSet")["spec"]["template"]["spec"]
    pre_stop = spec["containers"][0]["lifecycle"]["preStop"]["sleep"]["seconds"]
    drain = member_config(0, tmp_path).drain_time
    assert drain > 0
    assert pre_stop + drain + 5 <= spec["terminationGracePeriodSeconds"]


def test_push_monitoring_is_on_once_the_operator_creates_its_token(tmp_path: Path) -> None:
    view = pod_view(DOCS, 0, PASSWORD)
    assert load_pod_config(view, tmp_path / "a").monitor_token == ""  # no Secret: off
    with_token = pod_view(DOCS, 0, {**PASSWORD, ("migratory-monitoring", "token"): "t0k3n"})
    assert load_pod_config(with_token, tmp_path / "b").monitor_token == "t0k3n"


def test_the_readmes_kubectl_steps_name_the_installs_resources() -> None:
    """Each resource a kubectl step of deploy/k8s/README.md names is one the install
    makes: the StatefulSet, its pods (migratory-N), their claims (<template>-<pod>), the
    optional Secret and its key the pods read."""
    sts = find(DOCS, "StatefulSet")
    name = sts["metadata"]["name"]
    (claim,) = (c["metadata"]["name"] for c in sts["spec"]["volumeClaimTemplates"])
    env = sts["spec"]["template"]["spec"]["containers"][0]["env"]
    secret_keys = {(e["valueFrom"]["secretKeyRef"]["name"], e["valueFrom"]["secretKeyRef"]["key"])
                   for e in env if "secretKeyRef" in e.get("valueFrom", {})}
    text = (K8S_DIR / "README.md").read_text()
    steps = [*re.findall(r"`(kubectl [^`]*)`", text),  # in the text, in code blocks:
             *re.findall(r"^\s*(kubectl (?:[^\n]*\\\n)*[^\n]*)", text, re.MULTILINE)]
    named = []
    for step in steps:
        for kind, ref in re.findall(r"\b(statefulset|pvc|pod|logs)[/ \n]+([A-Za-z0-9-]+)", step):
            named.append(ref)
            expected = {"statefulset": name, "pvc": f"{claim}-{name}-N",
                        "pod": f"{name}-N", "logs": f"{name}-N"}[kind]
            assert ref == expected, (step, ref, expected)
        for secret, key in re.findall(r"secret generic ([a-z0-9-]+)[^`]*?--from-literal=(\w+)=",
                                      step):
            named.append(secret)
            assert (secret, key) in secret_keys, (step, secret_keys)
    # the patterns still find the README's steps
    assert {"migratory", "data-migratory-N", "migratory-N", "migratory-monitoring"} <= set(
        named), named
