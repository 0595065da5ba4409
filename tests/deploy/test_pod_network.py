"""The pod network of the local stand-in (tests/deploy/k8s_local.py): a pod deleted must
not cut the others off from the gateway, where the client Service and the kubelet are.

A Linux bridge whose own hardware address is not set takes the lowest of its ports' (the
pods' veths): deleting the pod whose veth had it moved the gateway's address under every
other pod, which went on sending to the old one for its ARP entry's life -- their
answers to the Service's connections and to the kubelet's probes were lost for seconds
to tens of seconds (measured: a pod still unable to connect to the gateway 15 s after).
Kubernetes' CNI bridge plugin sets its bridge's address for this reason
(containernetworking/cni#285, kubernetes/kubernetes#30783)."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent

SCRIPT = r"""
import socket, subprocess, sys, threading, time
sys.path.insert(0, sys.argv[1])
from k8s_local import GATEWAY, attach, make_network

def bridge_mac():
    out = subprocess.run(["ip", "-o", "link", "show", "br0"], capture_output=True,
                         text=True, check=True).stdout
    return out.split("link/ether ", 1)[1].split()[0]

def reaches(pid):  # a TCP connection from the pod to the gateway, within 5 s
    code = ("import socket; socket.create_connection(('%s', 7000), timeout=5).recv(1)"
            % GATEWAY)
    return subprocess.run(["nsenter", f"--net=/proc/{pid}/ns/net", "--", sys.executable,
                           "-c", code], timeout=30).returncode == 0

make_network()
listener = socket.create_server((GATEWAY, 7000))
def serve():
    while True:
        connection, _ = listener.accept()
        connection.sendall(b"!")
        connection.close()
threading.Thread(target=serve, daemon=True).start()
pods = [subprocess.Popen(["unshare", "--net", "--", "sleep", "120"]) for _ in range(3)]
attach(pods[0].pid, "va", "10.244.0.20", mac="02:00:00:00:00:01")  # the lowest address
attach(pods[1].pid, "vb", "10.244.0.21")
attach(pods[2].pid, "vc", "10.244.0.22")
before = bridge_mac()
print("reached before:", [reaches(p.pid) for p in pods[1:]])  # (their ARP entries)
pods[0].kill()
pods[0].wait()
deadline = time.monotonic() + 10
while subprocess.run(["ip", "link", "show", "va"], capture_output=True).returncode == 0:
    assert time.monotonic() < deadline, "the deleted pod's veth stayed"
    time.sleep(0.05)
print("bridge address", before, "->", bridge_mac())
print("reached after:", [reaches(p.pid) for p in pods[1:]])
for pod in pods[1:]:
    pod.kill()
"""


@pytest.mark.slow
def test_a_pod_deleted_leaves_the_others_their_way_to_the_gateway() -> None:
    assert shutil.which("unshare") and shutil.which("nsenter") and shutil.which("ip")
    result = subprocess.run(["unshare", "--net", "--", sys.executable, "-c", SCRIPT, str(HERE)],
                            capture_output=True, text=True, timeout=120)
    out = result.stdout + result.stderr
    assert result.returncode == 0, out
    assert "reached before: [True, True]" in out, out
    assert "reached after: [True, True]" in out, out  # before: [False, False]
    [moved] = [line for line in out.splitlines() if line.startswith("bridge address")]
    _, before, _, after = moved.rsplit(" ", 3)
    assert before == after, out  # the gateway's address did not follow the pods
