"""A stranger on loopback against a Guaranteed cluster's ports, while it works.

    .venv/bin/python benchmarks/cluster_port_attacks.py [--files 1024] [--flood 1500]

Three seeds (real ``python -m cluster serve`` processes, benchmarks/cluster_common.py),
each started with an open-file limit of ``--files``. A publisher publishes with
acknowledgements through one seed and a subscriber of that seed receives, while:

1. ``--flood`` idle connections each to the Raft leader's client, cluster and Raft
   ports are opened and held for 10 s (none sends a byte), and meanwhile the other
   follower is SIGKILLed and started again;
2. the leader's cluster port gets garbage, an oversize length prefix, a truncated
   frame, a wrong-password auth and a replayed one; its Raft port random bytes and a
   preamble made with another password.

Prints one JSON object: whether every member stayed up and who leads, the leader's
most open descriptors, how long the restarted seed took to be ready, publishes
acknowledged, and whether the subscriber got every acknowledged one in order without
a gap; the refusals the leader logged. Exit status 1 if a member exited or an
acknowledged publication was lost. Before the cluster port bounded its pending
handshakes (MAX_PENDING_HANDSHAKES), the flood took the leader past its limit of 1,024
descriptors: it could not write its Raft journal and exited.
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import resource
import signal
import socket
import struct
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import cbor2
from cluster_common import BenchCluster

sys.path.insert(0, str(Path(__file__).parents[1] / "tests" / "server"))
from rawclient import RawClient, delivered

from cluster import link
from cluster.tooling import member_command
from migratory.bench.procfs import die_with_parent
from migratory.model.message import Message, MessageType
from migratory.model.position import Position
from migratory.protocol import ops

SUBJECT = "/attack/bystander"
HOLD_SECONDS = 10.0


class LimitedCluster(BenchCluster):
    """Members started with RLIMIT_NOFILE ``files`` (soft and hard)."""

    def __init__(self, files: int) -> None:
        super().__init__("cluster-port-attacks")
        self.files = files

    def start(self, i: int) -> None:
        """As BenchCluster.start, the child's limit set before it runs (the member
        raises its soft limit to the hard one: both are ``files``)."""
        args, env = member_command(self.settings[i])
        files = self.files

        def limited() -> None:
            resource.setrlimit(resource.RLIMIT_NOFILE, (files, files))
            die_with_parent(signal.SIGKILL)

        with (self.log_dir / f"migratory-{i}.log").open("ab") as log:
            self.procs[i] = subprocess.Popen(
                args, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=log, env=env,
                cwd=Path(__file__).resolve().parent.parent, start_new_session=True,
                preexec_fn=limited,
            )

    def cluster_port(self, i: int) -> int:
        return int(self.settings[i]["ClusterMemberListen"].rsplit(":", 1)[1])


class Publisher(threading.Thread):
    def __init__(self, port: int, count: int) -> None:
        super().__init__(daemon=True)
        self.client = RawClient(port, timeout=15)
        self.client.connect("publisher")
        self.count = count
        self.acked: list[tuple[bytes, Position]] = []
        self.failed = 0
        self.stopped: str | None = None

    def run(self) -> None:
        for i in range(self.count):
            content = f"m{i:05d}".encode()
            try:
                status = self.client.publish(Message(SUBJECT, content, closure=str(i)))
            except (AssertionError, OSError) as exc:  # its member closed the connection
                self.stopped = f"after {i} publishes: {exc}"
                return
            if status.status is ops.Status.PUBLISH_OK and status.position is not None:
                self.acked.append((content, status.position))
            else:
                self.failed += 1
            time.sleep(0.01)


def descriptors(pid: int) -> int:
    try:
        return len(os.listdir(f"/proc/{pid}/fd"))
    except OSError:
        return 0


def hold(port: int, count: int, seconds: float) -> None:
    held = []
    for _ in range(count):
        try:
            held.append(socket.create_connection(("127.0.0.1", port), timeout=2))
        except OSError:
            break
    time.sleep(seconds)
    for sock in held:
        sock.close()


def frame(body: object) -> bytes:
    payload = cbor2.dumps(body)
    return struct.pack(">I", len(payload)) + payload


def bad_handshakes(port: int) -> None:
    """Each sent after the member's challenge, then wait for the member to close."""
    auth = frame({"t": "auth", "m": "127.0.0.1:1", "n": os.urandom(16), "mac": os.urandom(32)})
    me = link.LinkConnection(role="connect", member="127.0.0.1:1", password="not-it")
    me.initiate()
    for data in [os.urandom(300), b"\xff\xff\xff\xff", auth[:30], auth, None]:
        with socket.create_connection(("127.0.0.1", port), timeout=7) as sock:
            challenge = sock.recv(4096)
            if data is None:  # an auth answering an earlier challenge: a replay
                me.receive_data(challenge)
                event = me.next_event()
                assert isinstance(event, link.Outgoing)
                data = event.data
            sock.sendall(data)
            if data is auth[:30]:
                continue  # closed by us, truncated
            while sock.recv(4096):
                pass


def raft_garbage(port: int) -> None:
    for size in (1, 64, 5000, 1 << 16):
        with socket.create_connection(("127.0.0.1", port), timeout=5) as sock:
            sock.sendall(b"\xff" + os.urandom(size - 1))
    with socket.create_connection(("127.0.0.1", port), timeout=5) as sock:
        sock.sendall(b"MGRAFT\x00\x01" + os.urandom(56))  # the label, a wrong MAC
        while sock.recv(4096):
            pass


def gapless(got: list[Message], acked: list[tuple[bytes, Position]]) -> bool:
    updates = [m.position for m in got if m.type is not MessageType.SNAPSHOT]
    by_content = {m.content: m.position for m in got if m.type is not MessageType.SNAPSHOT}
    consecutive = all(b.epoch == a.epoch and b.seq == a.seq + 1
                      for a, b in itertools.pairwise(updates))
    return consecutive and all(by_content.get(c) == p for c, p in acked)


def attack(cluster: LimitedCluster, flood: int, publishes: int) -> dict[str, Any]:
    leader = cluster.leader()
    victim, third = (leader + 1) % 3, (leader + 2) % 3
    subscriber = RawClient(cluster.port(third), timeout=15)
    subscriber.connect("subscriber")
    subscriber.subscribe(SUBJECT)
    publisher = Publisher(cluster.port(third), publishes)
    publisher.start()
    floods = [threading.Thread(target=hold, args=(port, flood, HOLD_SECONDS))
              for port in (cluster.port(leader), cluster.cluster_port(leader),
                           cluster.cluster_port(leader) + 1)]
    for thread in floods:
        thread.start()
    peak = 0
    for _ in range(10):  # 2 s of flood before the follower is killed
        peak = max(peak, descriptors(cluster.pid(leader)))
        time.sleep(0.2)
    cluster.kill(victim)
    cluster.start(victim)
    began = time.monotonic()
    ready_after = None
    while any(t.is_alive() for t in floods):
        peak = max(peak, descriptors(cluster.pid(leader)))
        if ready_after is None and cluster.ready(victim):
            ready_after = round(time.monotonic() - began, 2)
        time.sleep(0.2)
    unreachable = []
    for name, send in (("cluster", bad_handshakes), ("Raft", raft_garbage)):
        try:
            send(cluster.cluster_port(leader) + (name == "Raft"))
        except OSError as exc:
            unreachable.append(f"the leader's {name} port: {exc}")
    publisher.join(120)
    got: list[Message] = []
    wanted = {c for c, _ in publisher.acked}
    deadline = time.monotonic() + 30
    try:
        while not wanted <= {m.content for m in got} and time.monotonic() < deadline:
            timeout = max(0.1, deadline - time.monotonic())
            got.extend(delivered([subscriber.recv_op(timeout=timeout)]))
    except (AssertionError, OSError) as exc:
        unreachable.append(f"the subscriber's member: {exc}")
    exited = {i: p.poll() for i, p in enumerate(cluster.procs) if p and p.poll() is not None}
    try:
        leader_after: int | None = cluster.leader(timeout=5)
    except RuntimeError:
        leader_after = None
    log = (cluster.log_dir / f"migratory-{leader}.log").read_text(errors="replace")
    return {
        "files": cluster.files, "flood_per_port": flood,
        "members_exited": exited, "leader": leader, "leader_after": leader_after,
        "leader_peak_descriptors": peak, "restarted_seed_ready_after_s": ready_after,
        "acknowledged": len(publisher.acked), "not_acknowledged": publisher.failed,
        "publisher_stopped": publisher.stopped, "unreachable": unreachable,
        "delivered_in_order_without_gap": gapless(got, publisher.acked),
        "leader_refusals": [line.split(" ", 3)[3] for line in log.splitlines()
                            if " WARNING " in line and "refused" in line],
        "logs": str(cluster.log_dir),
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--files", type=int, default=1024, help="each member's open-file limit")
    parser.add_argument("--flood", type=int, default=1500, help="idle connections per port")
    parser.add_argument("--publishes", type=int, default=1500)
    args = parser.parse_args()
    cluster = LimitedCluster(args.files)
    with cluster:
        cluster.start_all()
        cluster.wait_ready()
        report = attack(cluster, args.flood, args.publishes)
    print(json.dumps(report, indent=2))
    survived = not report["members_exited"] and report["delivered_in_order_without_gap"]
    return 0 if survived else 1


if __name__ == "__main__":
    sys.exit(main())
