"""The member processes of a chaos run, their ports and proxies, and their HTTP endpoints.

Every member process is started and stopped by the runner, by PID.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

from chaos.proxy import Proxy
from chaos.schedule import member
from cluster.tooling import member_settings, start_member

PASSWORD = "chaos-cluster-password"


class Member:
    def __init__(
        self,
        index: int,
        settings: dict[str, str],
        client_port: int,
        http_port: int,
        log: Path,
        env: dict[str, str],
    ) -> None:
        self.index, self.name = index, member(index)
        self.settings, self.client_port, self.http_port = settings, client_port, http_port
        self.log, self.env = log, env
        self.process: subprocess.Popen[bytes] | None = None
        self.state = "down"  # up | killed | paused | left | down

    def start(self) -> None:
        old = os.environ.copy()
        try:
            os.environ.clear()
            os.environ.update(self.env)
            self.process = start_member(self.settings, self.log)
        finally:
            os.environ.clear()
            os.environ.update(old)
        self.state = "up"

    def signal(self, sig: int) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.send_signal(sig)

    def wait_exit(self, timeout: float) -> None:
        if self.process is None:
            return
        try:
            self.process.wait(timeout)
        except subprocess.TimeoutExpired:
            self.process.send_signal(signal.SIGCONT)
            self.process.kill()
            self.process.wait(10)


def build_members(
    *,
    count: int,
    seeds: int,
    base: int,
    proxies: bool,
    out: Path,
    env: dict[str, str],
) -> tuple[list[Member], dict[int, list[Proxy]], list[str]]:
    """The members of a Guaranteed cluster on ports from ``base`` (not started), their
    proxies by member index (cluster, Raft, client; none without ``proxies``) and the
    client URL of each member (its client proxy's when proxied).

    Member i serves clients and HTTP on base+10i and is known to its peers at
    base+1000+10i (Raft + 1). Proxied, it binds its cluster links on base+2000+10i and
    clients reach it through base+3000+10i.
    """
    members: list[Member] = []
    proxy_of: dict[int, list[Proxy]] = {}
    client_urls: list[str] = []
    for i in range(count):
        s = member_settings(
            i,
            members=count,
            seeds=seeds,
            mode="Guaranteed",
            base_port=base,
            password=PASSWORD,
            data_dir=out / "data",
        )
        client_port = base + 10 * i
        public = client_port
        if proxies:
            s["ClusterMemberBind"] = f"127.0.0.1:{base + 2000 + 10 * i}"
            public = base + 3000 + 10 * i
            cl = base + 1000 + 10 * i
            bind = base + 2000 + 10 * i
            proxy_of[i] = [
                Proxy(f"{member(i)}/cluster", cl, bind),
                Proxy(f"{member(i)}/raft", cl + 1, bind + 1),
                Proxy(f"{member(i)}/client", public, client_port),
            ]
        client_urls.append(f"ws://127.0.0.1:{public}")
        members.append(
            Member(i, s, client_port, client_port, out / "logs" / f"{member(i)}.log", env)
        )
    return members, proxy_of, client_urls


def http_json(port: int, path: str, timeout: float = 0.6) -> tuple[int, Any]:
    """(status, body): the JSON body for ``/cluster`` only; status 0 if unreachable."""
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=timeout) as r:
            return r.status, json.loads(r.read() or b"null") if path == "/cluster" else None
    except urllib.error.HTTPError as exc:
        return exc.code, None
    except (OSError, ValueError):
        return 0, None
