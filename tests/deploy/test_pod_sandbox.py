"""The pod stand-in gives a process what the kubelet would: its hostname, writable
volumes, a read-only root and ConfigMap (so a test cannot pass by writing where a real
pod could not)."""

from __future__ import annotations

import dataclasses
import sys
from pathlib import Path

from k8s_manifests import ROOT, documents, generated_secrets, pod_view
from pod_sandbox import PodProcess, bytecode_cache

PROBE = """
hostname
for path in /var/lib/migratory/w /tmp/w /etc/migratory/w /usr/w; do
  if touch "$path" 2>/dev/null; then echo "writable $path"; else echo "read-only $path"; fi
done
"""


def test_pod_sees_its_hostname_and_only_its_volumes_are_writable(tmp_path: Path) -> None:
    view = pod_view(documents(), 2, generated_secrets("x"))
    assert view.read_only_root
    probe = dataclasses.replace(view, command=("sh", "-c", PROBE))
    pod = PodProcess(probe, pod_dir=tmp_path / view.name, bin_dir=Path(sys.executable).parent,
                     hosts="127.0.0.1 localhost\n")
    assert pod.proc.wait(30) == 0, pod.log()
    pod.stop()
    assert pod.log().split() == [
        "migratory-2",
        "writable", "/var/lib/migratory/w",
        "writable", "/tmp/w",
        "read-only", "/etc/migratory/w",
        "read-only", "/usr/w",
    ]
    assert not Path("/usr/w").exists()


CACHED = """
import os, cluster.node, pysyncobj.syncobj, gzip
print(*(os.path.exists(m.__cached__) for m in (cluster.node, pysyncobj.syncobj, gzip)))
"""


def test_a_pod_reads_a_members_bytecode_from_the_cache(tmp_path: Path) -> None:
    """A pod of the stand-in runs from the source tree on a read-only root: without a
    bytecode cache written from outside, a member compiled the project's modules at every
    start (~200; 0.93 CPU-s to import a member's modules, 0.50 with the cache) -- the
    image's were compiled by its ``pip install``. Its own modules, its Raft's
    dependencies', the standard library's: each has bytecode where the pod looks."""
    bin_dir = Path(sys.executable).parent
    cache = bytecode_cache(bin_dir, [ROOT / "migratory", ROOT / "cluster"])
    view = pod_view(documents(), 0, generated_secrets("x"))
    probe = dataclasses.replace(view, command=("python", "-c", CACHED))
    pod = PodProcess(probe, pod_dir=tmp_path / view.name, bin_dir=bin_dir, hosts="",
                     bytecode=cache)
    assert pod.proc.wait(30) == 0, pod.log()
    pod.stop()
    assert pod.log().split() == ["True", "True", "True"], pod.log()


def test_the_cache_is_warmed_once_for_the_same_sources(tmp_path: Path) -> None:
    """Each play warmed the cache again (0.33 CPU-s): now once for the same Python and
    sources, and again when a module changes (its bytecode then is the new source's)."""
    bin_dir = Path(sys.executable).parent
    module = tmp_path / "package" / "module.py"
    module.parent.mkdir()
    module.write_text("A = 1\n")
    prefix = bytecode_cache(bin_dir, [module.parent])
    cached = prefix / str(module.parent).lstrip("/") / f"module.{sys.implementation.cache_tag}.pyc"

    def source_size() -> int:  # what the bytecode was compiled from (PEP 552 header)
        return int.from_bytes(cached.read_bytes()[12:16], "little")

    assert source_size() == 6
    cached.unlink()
    bytecode_cache(bin_dir, [module.parent])  # warmed already: not again
    assert not cached.exists()
    module.write_text("A = 22\n")
    bytecode_cache(bin_dir, [module.parent])
    assert source_size() == 7
