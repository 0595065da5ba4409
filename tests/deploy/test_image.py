"""What the image runs, without a container engine: the wheel built as deploy/Dockerfile
builds it, installed alone (no test extras) into a fresh virtual environment, then a
pod's command started from that environment as the StatefulSet starts it."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import tomllib
from collections.abc import Iterator
from pathlib import Path

import pytest
from k8s_manifests import MONITOR_PORT, ROOT, documents, find, generated_secrets, pod_view
from pod_sandbox import PodProcess

DOCKERFILE = ROOT / "deploy" / "Dockerfile"


def packages_of_the_test_extra() -> set[str]:
    """The test extra's packages, less those the server itself depends on (wsproto comes
    with trio-websocket)."""
    with (ROOT / "pyproject.toml").open("rb") as file:
        extra = tomllib.load(file)["project"]["optional-dependencies"]["test"]
    names = {re.split(r"[<>=\[ ;]", item, maxsplit=1)[0].lower() for item in extra}
    return names - {"wsproto"}


def dockerfile_instruction(name: str) -> list[str]:
    """The last ``NAME [...]`` (exec form) instruction of the Dockerfile."""
    found = re.findall(rf"^{name} (\[.*\])$", DOCKERFILE.read_text(), flags=re.MULTILINE)
    assert found, f"no {name} in exec form"
    value: list[str] = json.loads(found[-1])
    return value


def dockerfile_env() -> dict[str, str]:
    env = {}
    for line in re.findall(r"^ENV (.*)$", DOCKERFILE.read_text(), flags=re.MULTILINE):
        for item in line.split():
            key, _, value = item.partition("=")
            env[key] = value
    return env


def pip_in(venv: Path, *args: str) -> list[str]:
    """This environment's pip acting on ``venv`` (``pip --python``): the venv is made
    without a pip of its own (no ensurepip, ~5-10 s), so it holds only what the wheel
    installs."""
    return [sys.executable, "-m", "pip", "--python", str(venv / "bin" / "python"), *args]


@pytest.fixture(scope="module")
def image_env() -> Iterator[Path]:
    """A fresh venv with only the wheel (and its dependencies); outside /tmp, which a
    pod gets as an emptyDir."""
    base = ROOT / "build" / f"image-test-{os.getpid()}"
    shutil.rmtree(base, ignore_errors=True)
    base.mkdir(parents=True)
    try:
        subprocess.run(
            [sys.executable, "-m", "pip", "wheel", "--quiet", "--no-deps",
             "--wheel-dir", str(base / "wheels"), str(ROOT)],
            check=True, capture_output=True, timeout=300,
        )
        (wheel,) = (base / "wheels").glob("migratory-*.whl")
        subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(base / "venv")],
                       check=True, timeout=120)
        subprocess.run(
            pip_in(base / "venv", "install", "--quiet", str(wheel)),
            check=True, capture_output=True, timeout=600,
        )
        yield base / "venv"
    finally:
        shutil.rmtree(base, ignore_errors=True)


@pytest.mark.slow
def test_the_wheel_installs_without_test_extras(image_env: Path) -> None:
    listing = subprocess.run(
        pip_in(image_env, "list", "--format=json"),
        check=True, capture_output=True, text=True, timeout=60,
    )
    installed = {p["name"].lower() for p in json.loads(listing.stdout)}
    assert {"migratory", "trio", "pysyncobj", "cbor2"} <= installed
    extra = packages_of_the_test_extra()
    assert {"pytest", "pyspark", "kubernetes-validate"} <= extra
    assert not installed & extra, installed & extra


@pytest.mark.slow
def test_the_wheel_carries_the_browser_files(image_env: Path) -> None:
    """make image builds them first (as make test does): the dashboard and
    /client/migratory.js work from the installed wheel."""
    code = (
        "from migratory.server.web_assets import CLIENT_ASSETS, DASHBOARD_ASSETS, STATIC_DIR;"
        "print(all((STATIC_DIR / a.file).is_file() for a in "
        "[*CLIENT_ASSETS.values(), *DASHBOARD_ASSETS.values()]), STATIC_DIR)"
    )
    found = subprocess.run(
        [str(image_env / "bin" / "python"), "-c", code],
        check=True, capture_output=True, text=True, timeout=60, cwd=image_env,
    )
    assert found.stdout.startswith("True "), found.stdout
    assert str(image_env) in found.stdout  # the installed copy, not the source tree


@pytest.mark.slow
def test_the_image_entrypoint_is_the_pods_command() -> None:
    sts = find(documents(), "StatefulSet")
    command = sts["spec"]["template"]["spec"]["containers"][0]["command"]
    assert dockerfile_instruction("ENTRYPOINT") + dockerfile_instruction("CMD") == command
    user = re.findall(r"^USER (\d+):(\d+)$", DOCKERFILE.read_text(), flags=re.MULTILINE)
    security = sts["spec"]["template"]["spec"]["securityContext"]
    assert user == [(str(security["runAsUser"]), str(security["runAsGroup"]))]


@pytest.mark.slow
def test_a_pod_runs_from_the_installed_wheel(image_env: Path, tmp_path: Path) -> None:
    docs = documents()
    view = pod_view(docs, 0, generated_secrets("a-generated-password"))  # + cluster TLS
    view.env.update(dockerfile_env())
    hosts = f"127.0.0.1 localhost\n127.0.0.1 {view.name}.{view.subdomain} {view.name}\n"
    pod = PodProcess(view, pod_dir=tmp_path / view.name, bin_dir=image_env / "bin",
                     hosts=hosts)
    try:
        pod.wait_http("/healthz", 200, timeout=60)
        pod.wait_http("/readyz", 503, timeout=10)  # a lone seed: no Raft majority
        status, body = pod.http_get("/metrics", MONITOR_PORT)
        assert status == 200 and "migratory_connections_open" in body
        assert pod.proc.poll() is None
    finally:
        code = pod.stop()
    assert code == 0, pod.log()
    assert "Traceback" not in pod.log()
    job = find(docs, "Job")["spec"]["template"]["spec"]["containers"][0]["command"]
    helped = subprocess.run(
        [str(image_env / "bin" / job[0]), *job[1:3], "--help"],
        capture_output=True, text=True, timeout=60,
    )
    assert helped.returncode == 0, helped.stderr
