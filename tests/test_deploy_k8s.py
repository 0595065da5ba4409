"""The Kubernetes manifest's configuration is one the server accepts, for every pod."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from migratory.config import load_config, parse_config_text

MANIFEST = Path(__file__).resolve().parent.parent / "deploy" / "k8s" / "migratory.yaml"


def config_file_text() -> str:
    lines = MANIFEST.read_text().splitlines()
    start = next(i for i, line in enumerate(lines) if "migratory.conf: |" in line) + 1
    block = []
    for line in lines[start:]:
        if not line.startswith("    "):
            break
        block.append(line[4:])
    return "\n".join(block)


def max_replicas() -> int:
    match = re.search(r"maxReplicas: (\d+)", MANIFEST.read_text())
    assert match
    return int(match.group(1))


@pytest.mark.parametrize("ordinal", range(max_replicas()))
def test_every_pod_gets_a_valid_config(ordinal: int) -> None:
    values = parse_config_text(config_file_text(), source="configmap")
    pod = f"migratory-{ordinal}"
    values.update(
        ServerName=pod,
        ClusterMemberListen=f"{pod}.migratory-members:9800",
        ClusterPassword="from-the-secret",
    )
    config = load_config(overrides=values, environ={})
    assert config.member_index == ordinal
    assert config.is_seed == (ordinal < 3)
    assert len(config.cluster_members) == max_replicas()


def test_env_overrides_use_keys_the_server_knows() -> None:
    names = re.findall(r"name: (MIGRATORY_CFG_\w+)", MANIFEST.read_text())
    assert names
    from migratory.config import env_overrides

    env_overrides({name: "x" for name in names})  # raises on an unknown key


def test_cluster_data_dir_is_a_persistent_volume_of_each_pod() -> None:
    data_dir = parse_config_text(config_file_text(), source="configmap")["ClusterDataDir"]
    text = MANIFEST.read_text()
    mount = re.search(r"\{name: (\w+), mountPath: " + re.escape(data_dir) + r"\}", text)
    assert mount, f"nothing is mounted at ClusterDataDir {data_dir}"
    claims = text[text.index("volumeClaimTemplates:") :]
    assert re.search(r"name: " + mount.group(1) + r"\b", claims), "the mount is not a claim"
