"""The pod stand-in gives a process what the kubelet would: its hostname, writable
volumes, a read-only root and ConfigMap (so a test cannot pass by writing where a real
pod could not)."""

from __future__ import annotations

import dataclasses
import sys
from pathlib import Path

from k8s_manifests import documents, generated_secrets, pod_view
from pod_sandbox import PodProcess

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
