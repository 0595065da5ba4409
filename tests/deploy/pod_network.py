"""The pod network of the StatefulSet stand-in (tests/deploy/k8s_local.py), in the private
network namespace of a play (``unshare --net``): a bridge at :data:`GATEWAY` and, for
each pod, a veth into the pod's own network namespace."""

from __future__ import annotations

import os
import subprocess
import time

SUBNET = "10.244.0"
GATEWAY = f"{SUBNET}.1"

BRIDGE_MAC = "02:42:0a:f4:00:01"
"""The pod network's bridge's own hardware address, set: a Linux bridge without one takes
the lowest of its ports', so deleting the pod whose veth had it moved the gateway's
address under every other pod, which kept sending to the old one for its ARP entry's
life (seconds to tens of seconds): their answers to the Service and to the kubelet were
lost (test_pod_network.py). CNI's bridge plugin sets its bridge's address for this."""


def sh(*args: str) -> None:
    subprocess.run(args, check=True, capture_output=True, timeout=30)


def make_network() -> None:
    """The pod network in this (private) network namespace: bridge ``br0`` at GATEWAY."""
    sh("ip", "link", "set", "lo", "up")
    sh("ip", "link", "add", "br0", "address", BRIDGE_MAC, "type", "bridge")
    sh("ip", "addr", "add", f"{GATEWAY}/24", "dev", "br0")
    sh("ip", "link", "set", "br0", "up")


def attach(pid: int, veth: str, ip: str, *, mac: str | None = None) -> None:
    """Process ``pid``'s network namespace (once it has its own) on the bridge at ``ip``,
    through veth ``veth`` (its bridge side at ``mac``: a test's, else a random one)."""
    mine, theirs = "/proc/self/ns/net", f"/proc/{pid}/ns/net"
    deadline = time.monotonic() + 10
    while os.readlink(theirs) == os.readlink(mine):  # not unshared yet
        assert time.monotonic() < deadline, f"process {pid} got no network namespace"
        time.sleep(0.005)
    address = [] if mac is None else ["address", mac]
    sh("ip", "link", "add", veth, *address, "type", "veth", "peer", "name", "eth0", "netns",
       str(pid))
    sh("ip", "link", "set", veth, "master", "br0")
    sh("ip", "link", "set", veth, "up")
    inside = ["nsenter", f"--net=/proc/{pid}/ns/net", "--"]
    sh(*inside, "ip", "addr", "add", f"{ip}/24", "dev", "eth0")
    sh(*inside, "ip", "link", "set", "eth0", "up")
