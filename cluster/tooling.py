"""``migratory cluster up`` and ``migratory cluster status``: a local cluster of processes."""

from __future__ import annotations

import argparse
import json
import os
import random
import secrets
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

DEFAULT_STATE = ".migratory-cluster.json"


@dataclass(frozen=True, slots=True)
class LocalMember:
    name: str  # migratory-0, migratory-1, ... as StatefulSet pods are named
    client_url: str
    http_url: str
    cluster_address: str
    pid: int


def member_settings(
    index: int,
    *,
    members: int,
    seeds: int,
    mode: str,
    base_port: int,
    password: str,
    data_dir: Path,
) -> dict[str, str]:
    """The config of member ``index`` of a loopback cluster; its Raft state goes in
    ``data_dir/migratory-INDEX``."""
    cluster = [f"127.0.0.1:{base_port + 1000 + 10 * i}" for i in range(members)]
    return {
        "ServerName": f"migratory-{index}",
        "Listen": f"127.0.0.1:{base_port + 10 * index}",
        "ClusterMembers": ", ".join(cluster),
        "ClusterMemberListen": cluster[index],
        "ClusterSeedMemberCount": str(seeds) if mode == "Guaranteed" else "",
        "ClusterDeliveryMode": mode,
        "ClusterPassword": password,
        "ClusterDataDir": str(data_dir / f"migratory-{index}") if mode == "Guaranteed" else "",
    }


def _member_ports(base_port: int, index: int) -> list[int]:
    """Every port member ``index`` of a loopback cluster may use: clients and HTTP on
    base+10i, cluster links on base+1000+10i and Raft on that + 1; behind the chaos
    runner's proxies the member really binds base+2000+10i (+ 1 for Raft) and clients
    reach it on base+3000+10i (+ 1 kept free as well)."""
    client = base_port + 10 * index
    return [client] + [client + offset + d for offset in (1000, 2000, 3000) for d in (0, 1)]


def _port_free(port: int) -> bool:
    with socket.socket() as sock:
        try:
            sock.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def free_base_port(members: int, rng: random.Random | None = None) -> int:
    """A base port (a multiple of 10 in [20000, 40000)) whose ``_member_ports`` are all
    free on 127.0.0.1 for ``members`` members; ``rng`` defaults to the module's."""
    randrange = rng.randrange if rng is not None else random.randrange
    for _ in range(200):
        base = randrange(20_000, 40_000, 10)
        if all(_port_free(p) for i in range(members) for p in _member_ports(base, i)):
            return base
    raise RuntimeError("no free ports")


def start_member(settings: dict[str, str], log_path: Path) -> subprocess.Popen[bytes]:
    args = [sys.executable, "-m", "migratory", "serve"]
    for key, value in settings.items():
        args += ["--set", f"{key}={value}"]
    with log_path.open("ab") as log:
        return subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=log)


def _up(args: argparse.Namespace) -> int:
    if args.members < 1 or (args.mode == "guaranteed" and args.members < 3):
        print("migratory cluster up: Guaranteed mode needs --members 3 or more", file=sys.stderr)
        return 2
    mode = "Guaranteed" if args.mode == "guaranteed" else "Standard"
    password = os.environ.get("MIGRATORY_CLUSTER_PASSWORD") or secrets.token_urlsafe(18)
    log_dir = Path(args.log_dir)
    log_dir.mkdir(parents=True, exist_ok=True)
    members: list[LocalMember] = []
    processes: list[subprocess.Popen[bytes]] = []
    try:
        for i in range(args.members):
            settings = member_settings(
                i, members=args.members, seeds=args.seeds, mode=mode,
                base_port=args.base_port, password=password, data_dir=log_dir / "data",
            )
            process = start_member(settings, log_dir / f"migratory-{i}.log")
            processes.append(process)
            host_port = settings["Listen"]
            members.append(LocalMember(
                f"migratory-{i}", f"ws://{host_port}", f"http://{host_port}",
                settings["ClusterMemberListen"], process.pid,
            ))
        Path(args.state).write_text(json.dumps([asdict(m) for m in members], indent=2))
        print(f"{mode} cluster of {args.members} (logs in {log_dir}/):")
        for member in members:
            print(f"  {member.name}  {member.client_url}  cluster {member.cluster_address}"
                  f"  pid {member.pid}")
        print("servers for clients: " + " ".join(m.client_url for m in members))
        print("Ctrl-C stops them all.", flush=True)
        while all(p.poll() is None for p in processes):
            time.sleep(0.5)
        dead = [m.name for m, p in zip(members, processes, strict=True) if p.poll() is not None]
        print(f"member(s) exited: {', '.join(dead)}; stopping the rest", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("\nstopping the cluster ...", flush=True)
        return 0
    finally:
        stop_all(processes)
        Path(args.state).unlink(missing_ok=True)


def stop_all(processes: list[subprocess.Popen[bytes]], timeout: float = 10.0) -> None:
    for process in processes:
        if process.poll() is None:
            process.send_signal(signal.SIGTERM)
    deadline = time.monotonic() + timeout
    for process in processes:
        try:
            process.wait(max(0.1, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


def fetch_status(http_url: str, timeout: float = 2.0) -> dict[str, Any]:
    try:
        with urllib.request.urlopen(f"{http_url}/cluster", timeout=timeout) as reply:
            status: dict[str, Any] = json.loads(reply.read())
            return status
    except (OSError, urllib.error.URLError, ValueError) as exc:
        return {"error": str(exc)}


def _status(args: argparse.Namespace) -> int:
    if args.server:
        urls = [u.replace("ws://", "http://") for u in args.server]
        names = urls
    else:
        try:
            members = json.loads(Path(args.state).read_text())
        except OSError:
            print(f"no cluster state file {args.state!r}: is `migratory cluster up` running? "
                  "(or pass --server URL ...)", file=sys.stderr)
            return 2
        urls = [m["http_url"] for m in members]
        names = [m["name"] for m in members]
    print(f"{'member':<14} {'role':<9} {'ready':<6} {'raft':<10} {'leader':<16} "
          f"{'clsn':>7}  subjects / cache positions")
    for name, url in zip(names, urls, strict=True):
        status = fetch_status(url)
        if "error" in status:
            print(f"{name:<14} DOWN      ({status['error']})")
            continue
        print(f"{name:<14} {status.get('role', '?'):<9} {status.get('ready')!s:<6} "
              f"{status.get('raft_state') or '-':<10} {status.get('raft_leader') or '-':<16} "
              f"{status.get('applied_clsn', '-')!s:>7}  {_positions(url)}")
    return 0


def _positions(http_url: str) -> str:
    try:
        with urllib.request.urlopen(f"{http_url}/stats", timeout=2) as reply:
            stats = json.loads(reply.read())
    except (OSError, ValueError):
        return "?"
    return f"{stats.get('subjects', 0)} subjects, {stats.get('messages_published', 0)} messages"


def add_cluster_commands(commands: Any) -> None:
    cluster = commands.add_parser("cluster", help="run or inspect a local cluster")
    sub = cluster.add_subparsers(dest="cluster_command", required=True, metavar="COMMAND")
    up = sub.add_parser("up", help="start a cluster of member processes on 127.0.0.1")
    up.add_argument("--members", type=int, default=3)
    up.add_argument("--seeds", type=int, default=3, choices=(3, 5))
    up.add_argument("--mode", choices=("guaranteed", "standard"), default="guaranteed")
    up.add_argument("--base-port", type=int, default=8800,
                    help="member i serves clients on base+10*i, cluster links on base+1000+10*i")
    up.add_argument("--state", default=DEFAULT_STATE, help="where to record the members")
    up.add_argument("--log-dir", default="cluster-logs")
    up.set_defaults(func=_up)
    status = sub.add_parser("status", help="role, leader and positions of each member")
    status.add_argument("--state", default=DEFAULT_STATE)
    status.add_argument("--server", action="append", help="a member's client URL (repeatable)")
    status.set_defaults(func=_status)
