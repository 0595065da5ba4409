"""Each build of the image has its own tag (deploy/image_tag.sh, `make image`), and
``make k8s-image`` points the install at it: a node that pulled an earlier build's tag
(imagePullPolicy IfNotPresent) never runs it in place of a new build."""

from __future__ import annotations

import shutil
import subprocess
import tomllib
from pathlib import Path

import yaml
from k8s_manifests import K8S_DIR, ROOT, kubectl

SCRIPT = ROOT / "deploy" / "image_tag.sh"
VERSION = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["version"]


def git(repo: Path, *args: str) -> str:
    return subprocess.run(
        ["git", "-c", "user.name=t", "-c", "user.email=t@example.com", *args], cwd=repo,
        check=True, capture_output=True, text=True, timeout=30,
    ).stdout.strip()


def tag(repo: Path) -> str:
    return subprocess.run(["sh", str(repo / "deploy" / "image_tag.sh")], check=True,
                          capture_output=True, text=True, timeout=30).stdout.strip()


def checkout(tmp_path: Path) -> Path:
    """A git checkout with the files the tag is made of: the script, pyproject.toml,
    the Dockerfile and a file in each directory it copies, and deploy/k8s."""
    repo = tmp_path / "repo"
    (repo / "deploy").mkdir(parents=True)
    for name in ("deploy/image_tag.sh", "deploy/Dockerfile", "pyproject.toml", "README.md"):
        shutil.copy(ROOT / name, repo / name)
    shutil.copytree(K8S_DIR, repo / "deploy" / "k8s")
    for package in ("migratory", "cluster", "clients/python", "chaos", "spark_analysis"):
        (repo / package).mkdir(parents=True)
        (repo / package / "code.py").write_text("A = 1\n")
    git(repo, "init", "-q")
    git(repo, "add", ".")
    git(repo, "commit", "-q", "-m", "one")
    return repo


def test_every_build_of_other_files_has_another_tag(tmp_path: Path) -> None:
    repo = checkout(tmp_path)
    clean = tag(repo)
    assert clean == f"{VERSION}-g{git(repo, 'rev-parse', '--short=12', 'HEAD')}"
    code = repo / "migratory" / "code.py"
    code.write_text("A = 2\n")
    edited = tag(repo)
    assert edited.startswith(f"{clean}-dirty.")
    code.write_text("A = 3\n")
    assert tag(repo) not in (clean, edited)
    code.write_text("A = 2\n")
    assert tag(repo) == edited  # the same files, the same tag
    code.write_text("A = 1\n")
    assert tag(repo) == clean
    (repo / "cluster" / "new.py").write_text("B = 1\n")  # untracked, copied all the same
    assert tag(repo) not in (clean, edited)
    git(repo, "add", ".")
    git(repo, "commit", "-q", "-m", "two")
    assert tag(repo) not in (clean, edited) and not tag(repo).endswith(clean[-12:])
    assert "-dirty." not in tag(repo)


def test_a_change_outside_the_image_keeps_its_tag(tmp_path: Path) -> None:
    """``make k8s-image`` edits deploy/k8s/kustomization.yaml: not a file of the image,
    so the tag it writes there stays the tag of the image built."""
    repo = checkout(tmp_path)
    clean = tag(repo)
    kustomization = repo / "deploy" / "k8s" / "kustomization.yaml"
    kustomization.write_text(kustomization.read_text() + "# edited\n")
    assert tag(repo) == clean


def make(*args: str) -> str:
    result = subprocess.run(["make", "-s", "-C", str(ROOT), *args], capture_output=True,
                            text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    return result.stdout.strip()


def test_make_builds_and_deploys_the_tree_s_tag(tmp_path: Path) -> None:
    """The README's steps: ``make image``, ``make image-push`` and ``make k8s-image`` with
    one IMAGE_REPO name one image, the tag of this tree; the install then runs it in
    every pod and in its Job."""
    repo = "localhost:5001/migratory"  # a registry with a port (kind's local registry)
    image = make("image-name", f"IMAGE_REPO={repo}")
    assert image == f"{repo}:{tag(ROOT)}"
    built = make("-n", "-o", "migratory/server/static/client/migratory.js", "image",
                 f"IMAGE_REPO={repo}")
    assert f"build -f deploy/Dockerfile -t {image} ." in built
    assert f"push {image}" in make("-n", "image-push", f"IMAGE_REPO={repo}")
    install = tmp_path / "k8s"
    shutil.copytree(K8S_DIR, install)
    make("k8s-image", f"IMAGE_REPO={repo}", f"K8S_DIR={install}")
    rendered = subprocess.run([kubectl(), "kustomize", str(install)], capture_output=True,
                              text=True, timeout=60, check=True).stdout
    docs = [d for d in yaml.safe_load_all(rendered) if d]
    assert {c["image"] for d in docs if d["kind"] in ("StatefulSet", "Job")
            for c in d["spec"]["template"]["spec"]["containers"]} == {image}


def test_set_image_refuses_what_is_not_an_image_name(tmp_path: Path) -> None:
    install = tmp_path / "k8s"
    shutil.copytree(K8S_DIR, install)
    before = (install / "kustomization.yaml").read_text()
    for repo, image_tag in (("Registry/Migratory", "1"), ("migratory", ""),
                            ("migratory", "a:b"), ("migratory", "-x")):
        result = subprocess.run(
            ["python3", str(K8S_DIR / "set_image.py"), str(install / "kustomization.yaml"),
             repo, image_tag], capture_output=True, text=True, timeout=30)
        assert result.returncode == 1 and "not an image" in result.stderr, result
    assert (install / "kustomization.yaml").read_text() == before
