"""A pod's member forked from the zygote (tests/deploy/pod_fork.py) is what the exec'd
one was: the pod's own namespaces, hostname, cluster DNS, ConfigMap and volume mounts,
cwd, argv and environment; and the real command fails alike."""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
import sys
from pathlib import Path
from typing import Any

import pytest
from k8s_manifests import ROOT, documents, generated_secrets, pod_view
from pod_fork import PodZygotes
from pod_sandbox import PodProcess
from zygote_process import ForkedProcess

PROBE = """
import json, os, socket, sys
def ns(kind):
    return os.stat(f"/proc/self/ns/{kind}").st_ino
def files(root):
    return {name: open(os.path.join(root, name)).read() for name in sorted(os.listdir(root))}
mounts = [line.split()[4:6] for line in open("/proc/self/mountinfo")]
print(json.dumps({
    "ns": {kind: ns(kind) for kind in ("net", "uts", "mnt")},
    "hostname": socket.gethostname(), "hosts": open("/etc/hosts").read(),
    "config": files("/etc/migratory"), "tls": files("/etc/migratory-tls"),
    "volume": os.listdir("/var/lib/migratory"), "mounts": mounts, "cwd": os.getcwd(),
    "root": os.stat("/").st_ino, "argv": sys.argv, "orig_argv": sys.orig_argv,
    "executable": sys.executable, "path0": sys.path[0], "env": dict(os.environ),
    "main": [__name__, globals().get("__file__"), sys.modules["__main__"].__dict__ is globals()],
    "flags": list(sys.flags), "pycache": sys.pycache_prefix,
    "streams": [(s.encoding, s.line_buffering, s.write_through) for s in (sys.stdout, sys.stderr)],
    "links": [name for _, name in socket.if_nameindex()],
}), flush=True)
"""

BIN = Path(sys.executable).parent
HOSTS = "127.0.0.1 localhost\n10.244.0.9 migratory-1.migratory migratory-1\n"
KINDS = ("net", "uts", "mnt")


def probe(tmp_path: Path, zygotes: PodZygotes | None, name: str,
          secrets: dict[tuple[str, str], str], command: tuple[str, ...],
          ) -> tuple[PodProcess, dict[str, Any]]:
    """What a pod running PROBE saw, with ``said["sandbox"]``: the namespaces of its
    sandbox's holder while the pod ran (a forked pod's; an exec'd pod's own)."""
    view = pod_view(documents(), 1, secrets)
    view = dataclasses.replace(view, command=command)
    pod = PodProcess(view, pod_dir=tmp_path / name, bin_dir=BIN, hosts=HOSTS, zygotes=zygotes)
    holder = pod.namespaces_pid
    sandbox = None
    if holder != pod.pid:
        sandbox = {kind: os.stat(f"/proc/{holder}/ns/{kind}").st_ino for kind in KINDS}
    assert pod.proc.wait(30) == 0, pod.log()
    pod.stop()
    said: dict[str, Any] = json.loads(pod.log())
    said["sandbox"] = sandbox or said["ns"]
    return pod, said


@pytest.mark.parametrize("form", ["script", "-c"])
def test_a_forked_pod_sees_what_an_exec_d_one_sees(tmp_path: Path, form: str) -> None:
    """PROBE as the manifest's command is run (a script of the tests' interpreter, as the
    ``migratory`` console script; outside /tmp, which the pod's emptyDir hides), or as
    ``python -c``."""
    scripts = ROOT / "build" / f"pod-fork-test-{os.getpid()}"
    scripts.mkdir(parents=True, exist_ok=True)
    (scripts / "probe").write_text(f"#!{sys.executable}\n{PROBE}")
    (scripts / "probe").chmod(0o755)
    command = (str(scripts / "probe"),) if form == "script" else ("python", "-c", PROBE)
    zygotes = PodZygotes()
    secrets = generated_secrets("x")
    try:
        forked, fork = probe(tmp_path, zygotes, "forked", secrets, (*command, "--flag"))
        execd, exec_ = probe(tmp_path, None, "exec", secrets, (*command, "--flag"))
    finally:
        zygotes.close()
        shutil.rmtree(scripts)
    assert isinstance(forked.proc, ForkedProcess)
    assert not isinstance(execd.proc, ForkedProcess)
    own = {kind: os.stat(f"/proc/self/ns/{kind}").st_ino for kind in KINDS}
    for said in (fork, exec_):  # each in its own sandbox's namespaces, not the tests'
        namespaces = said.pop("ns")
        assert namespaces == said.pop("sandbox")
        assert all(namespaces[kind] != own[kind] for kind in KINDS), namespaces
    assert fork == exec_
    assert fork["hostname"] == "migratory-1" and fork["hosts"] == HOSTS
    assert fork["links"] == ["lo"] and fork["cwd"] == os.getcwd()
    assert "migratory.conf" in fork["config"] and fork["env"]["PWD"] == os.getcwd()
    assert fork["argv"] == ([command[0], "--flag"] if form == "script" else ["-c", "--flag"])


def test_the_member_refusing_its_config_as_exec_would(tmp_path: Path) -> None:
    """The manifest's own command (``migratory serve``, a console script run by its
    interpreter), with a setting the member refuses: the same exit code and message."""
    said = []
    secrets = generated_secrets("x")
    for name, zygotes in (("forked", PodZygotes()), ("exec", None)):
        view = pod_view(documents(), 0, secrets)
        view = dataclasses.replace(view, env={**view.env, "MIGRATORY_CFG_NONSENSE": "1"})
        pod = PodProcess(view, pod_dir=tmp_path / name, bin_dir=BIN, hosts=HOSTS,
                         zygotes=zygotes)
        code = pod.proc.wait(30)
        pod.stop()
        said.append((type(pod.proc).__name__, code, pod.log()))
        if zygotes is not None:
            zygotes.close()
    assert said[0][0] == "ForkedProcess" and said[1][0] == "Popen"
    assert said[0][1:] == said[1][1:] and said[0][1] != 0, said
