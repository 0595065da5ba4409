"""An upgrade's ``kubectl apply -k deploy/k8s`` over the install it replaces: the API
server refuses a change to an immutable field of an existing object (the whole apply
fails there), so no object of the same kind and name may differ in one. Checked on
the rendered installs, the refusals modelled from Kubernetes' validation."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import yaml
from k8s_manifests import K8S_DIR, Document, find, kubectl

FIXTURE = Path(__file__).parent / "upgrade_fixture" / "524f73f-install.yaml"

# What an update may change of a StatefulSet's spec (the API's message: "updates to
# statefulset spec for fields other than 'replicas', 'ordinals', 'template',
# 'updateStrategy', 'persistentVolumeClaimRetentionPolicy' and 'minReadySeconds' are
# forbidden"); a Job's pod template, selector, completions and completion mode cannot
# change (pkg/apis/batch/validation); a Service's clusterIP, a RoleBinding's roleRef.
STATEFULSET_MUTABLE = {"replicas", "ordinals", "template", "updateStrategy",
                       "persistentVolumeClaimRetentionPolicy", "minReadySeconds"}
IMMUTABLE: dict[str, tuple[str, ...]] = {
    "Job": ("spec.template", "spec.selector", "spec.completions", "spec.completionMode"),
    "Service": ("spec.clusterIP",),
    "RoleBinding": ("roleRef",),
}


def _at(doc: Document, path: str) -> Any:
    for key in path.split("."):
        doc = doc.get(key, {}) if isinstance(doc, dict) else {}
    return doc


def refused_by_apply(live: list[Document], applied: list[Document]) -> list[str]:
    """What the API server refuses when ``applied`` is applied over ``live``: each
    object of both with an immutable field changed, as ``Kind name: field``."""
    before = {(d["kind"], d["metadata"]["name"]): d for d in live}
    refused = []
    for doc in applied:
        old = before.get((doc["kind"], doc["metadata"]["name"]))
        if old is None:
            continue
        fields = list(IMMUTABLE.get(doc["kind"], ()))
        if doc["kind"] == "StatefulSet":
            keys = set(doc["spec"]) | set(old["spec"])
            fields += [f"spec.{key}" for key in sorted(keys - STATEFULSET_MUTABLE)]
        refused += [f"{doc['kind']} {doc['metadata']['name']}: {field}"
                    for field in fields if _at(old, field) != _at(doc, field)]
    return refused


def copy_install(tmp_path: Path, name: str = "k8s") -> Path:
    target = tmp_path / name
    shutil.copytree(K8S_DIR, target)
    return target


def set_image(install: Path, repo: str, tag: str) -> None:
    """What ``make k8s-image`` runs (deploy/k8s/set_image.py)."""
    subprocess.run([sys.executable, str(K8S_DIR / "set_image.py"),
                    str(install / "kustomization.yaml"), repo, tag],
                   check=True, capture_output=True, timeout=30)


def render(install: Path) -> list[Document]:
    result = subprocess.run([kubectl(), "kustomize", str(install)],
                            capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    return [doc for doc in yaml.safe_load_all(result.stdout) if doc]


def images(docs: list[Document]) -> set[str]:
    return {c["image"] for d in docs if d["kind"] in ("StatefulSet", "Job")
            for c in d["spec"]["template"]["spec"]["containers"]}


def test_an_upgrade_to_a_new_image_is_applied_without_a_refusal(tmp_path: Path) -> None:
    """The install Job ran the old image; the upgrade's apply must not try to change
    its pod template (within its ttlSecondsAfterFinished the Job is still there)."""
    install = copy_install(tmp_path)
    set_image(install, "registry.example.com:5000/migratory", "0.1.0-g1111111111aa")
    old = render(install)
    set_image(install, "registry.example.com:5000/migratory", "0.1.0-g2222222222bb")
    new = render(install)
    assert images(new) == {"registry.example.com:5000/migratory:0.1.0-g2222222222bb"}
    assert refused_by_apply(old, new) == []
    # a new Job, which finds the Secrets made and leaves them; the old one goes after
    # its TTL (kubectl apply without --prune deletes nothing)
    assert find(old, "Job")["metadata"]["name"] != find(new, "Job")["metadata"]["name"]


def test_a_reapply_of_the_same_install_keeps_its_job(tmp_path: Path) -> None:
    """Applying the same install again changes nothing: no new Job each time."""
    install = copy_install(tmp_path)
    assert render(install) == render(copy_install(tmp_path, "again"))


def test_a_config_change_is_applied_without_a_refusal(tmp_path: Path) -> None:
    install = copy_install(tmp_path)
    old = render(install)
    conf = install / "migratory.conf"
    conf.write_text(conf.read_text() + "\nClusterRebalanceRate = 5\n")
    new = render(install)
    assert find(old, "StatefulSet") != find(new, "StatefulSet")  # rolls the pods
    assert refused_by_apply(old, new) == []


def test_the_upgrade_from_524f73f_is_applied_without_a_refusal(tmp_path: Path) -> None:
    """The install of 524f73f as rendered there (its image migratory:0.1.0), then this
    version's with a new image: README, "Upgrading"."""
    live = [doc for doc in yaml.safe_load_all(FIXTURE.read_text()) if doc]
    install = copy_install(tmp_path)
    set_image(install, "migratory", "0.1.0-g2222222222bb")
    assert refused_by_apply(live, render(install)) == []


def test_the_model_refuses_what_the_api_server_refuses(tmp_path: Path) -> None:
    """Planted: a grown volume claim template, a Job whose template changes under the
    same name (the install before the Job's name carried the hash)."""
    install = copy_install(tmp_path)
    old = render(install)
    sts = install / "statefulset.yaml"
    sts.write_text(sts.read_text().replace("storage: 8Gi", "storage: 16Gi"))
    assert refused_by_apply(old, render(install)) == [
        "StatefulSet migratory: spec.volumeClaimTemplates"]
    renamed = [
        {**d, "spec": {**d["spec"], "template": {}}} if d["kind"] == "Job" else d
        for d in old
    ]
    (refused,) = refused_by_apply(old, renamed)
    assert refused.startswith("Job migratory-cluster-password-") and refused.endswith(
        ": spec.template")


def _make_steps(section: str) -> list[list[str]]:
    text = (K8S_DIR / "README.md").read_text()
    body = text[text.index(f"## {section}\n"):]
    block = body[body.index("```sh\n") + 6:]
    block = block[:block.index("```")]
    steps = [line.split("#")[0].split() for line in block.replace("&&", "\n").splitlines()]
    return [step for step in steps if step]


def test_the_readmes_install_and_upgrade_steps_build_deploy_and_apply_one_image() -> None:
    """The steps of "Install" and "Upgrading" run targets and set variables the Makefile
    has, in order: build, push, set the install's image, apply; all of one IMAGE_REPO,
    none giving the tag (it is the build's: test_image_tag.py)."""
    makefile = (K8S_DIR.parents[1] / "Makefile").read_text()
    targets = set(re.findall(r"^([a-z0-9-]+):", makefile, re.MULTILINE))
    variables = set(re.findall(r"^([A-Z_]+)\s*[?:]?=", makefile, re.MULTILINE))
    for section in ("Install", "Upgrading"):
        steps = _make_steps(section)
        made = [s for s in steps if s[0] == "make"]
        assert [s[1] for s in made] == ["image", "image-push", "k8s-image"], (section, steps)
        given = [dict(arg.split("=", 1) for arg in s[2:]) for s in made]
        assert all(set(g) == {"IMAGE_REPO"} for g in given), (section, given)
        assert {g["IMAGE_REPO"] for g in given} == {"$REPO"}
        assert {s[1] for s in made} <= targets and {"IMAGE_REPO"} <= variables
        apply = steps.index(["kubectl", "apply", "-k", "deploy/k8s"])
        assert steps.index(made[-1]) < apply
        assert (K8S_DIR.parents[1] / "deploy" / "k8s").is_dir()
