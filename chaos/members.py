"""The member processes of a chaos run, their ports and proxies, and their HTTP endpoints.

Every member process is started and stopped by the runner, by PID. A member ended only
through :meth:`Member.signal` (SIGKILL, SIGTERM or SIGINT) was ended by the runner; any
other exit is a crash, reported once through ``on_crash`` (:meth:`Member.check_exit`).
"""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from chaos.proxy import Proxy
from chaos.schedule import member
from cluster.tooling import MQTT_OFFSET, free_base_port, member_settings, start_member
from cluster.up_checks import port_free
from migratory.config import Config, ConfigError, build_config
from migratory.config_file import Layer

PASSWORD = "chaos-cluster-password"
# the settings the runner gives every member itself (member_settings, the proxies'
# ClusterMemberBind, the compaction thresholds): ``--set`` may not change them
RUNNER_KEYS = frozenset({
    "ServerName", "Listen", "ClusterMembers", "ClusterMemberListen", "ClusterMemberBind",
    "ClusterSeedMemberCount", "ClusterDeliveryMode", "ClusterPassword", "ClusterDataDir",
    "ClusterLogCompactionEntries", "ClusterLogCompactionTime", "ListenMqtt",
})
# --fault: the server's test fault switch hits the 20th message fanned out to a raw
# auditor (clients named a0, a1) in each member process; the SDK would repair it.
# Several kinds at once: kind i hits auditor a<i>.
FAULT_AT = "20:a"


def fault_switch(kinds: str | None) -> str | None:
    """MIGRATORY_TEST_FAULT for ``--fault`` (one kind, or several comma-separated)."""
    if not kinds:
        return None
    names = kinds.split(",")
    if len(names) == 1:
        return f"{kinds}:{FAULT_AT}"
    return ",".join(f"{kind}:{FAULT_AT}{i}" for i, kind in enumerate(names))


ENDING_SIGNALS = (signal.SIGKILL, signal.SIGTERM, signal.SIGINT)
LOG_TAIL_LINES = 20
LOG_TAIL_BYTES = 16_384


class Member:
    def __init__(
        self,
        index: int,
        settings: dict[str, str],
        client_port: int,
        http_port: int,
        log: Path,
        env: dict[str, str],
        on_crash: Callable[[Member, int], None],
    ) -> None:
        """``on_crash(member, exit_status)``: called once per process that exits on its own."""
        self.index, self.name = index, member(index)
        self.settings, self.client_port, self.http_port = settings, client_port, http_port
        self.log, self.env, self.on_crash = log, env, on_crash
        self.process: subprocess.Popen[bytes] | None = None
        self.state = "down"  # up | killed | stopped | paused | left | crashed | down
        self.ended_by_runner = False  # the runner sent this process an ending signal
        self.exit_seen = False  # this process's exit was checked (and any crash reported)

    def start(self) -> None:
        self.check_exit()  # a crash of the previous process is reported before it is replaced
        old = os.environ.copy()
        try:
            os.environ.clear()
            os.environ.update(self.env)
            self.process = start_member(self.settings, self.log)
        finally:
            os.environ.clear()
            os.environ.update(old)
        self.state = "up"
        self.ended_by_runner = self.exit_seen = False

    def signal(self, sig: int) -> None:
        """Send ``sig`` if the process runs; SIGKILL/SIGTERM/SIGINT mark its exit as caused."""
        if self.process is not None and self.process.poll() is None:
            if sig in ENDING_SIGNALS:
                self.ended_by_runner = True
            self.process.send_signal(sig)

    def check_exit(self) -> None:
        """If the process has exited and the runner did not end it, report the crash
        (once per process) and mark the member ``crashed``. Cheap: one ``waitpid``."""
        p = self.process
        if p is None or self.exit_seen or p.poll() is None:
            return
        self.exit_seen = True
        if not self.ended_by_runner:
            self.state = "crashed"
            self.on_crash(self, p.returncode)

    def log_tail(self, lines: int = LOG_TAIL_LINES) -> str:
        """The last ``lines`` lines of the member's log (its stderr; restarts append)."""
        try:
            with self.log.open("rb") as fh:
                fh.seek(max(0, fh.seek(0, os.SEEK_END) - LOG_TAIL_BYTES))
                text = fh.read().decode("utf-8", "replace")
        except OSError as exc:
            return f"(log unreadable: {exc})"
        return "\n".join(text.splitlines()[-lines:])

    def wait_exit(self, timeout: float) -> bool:
        """Wait for the process to exit; SIGKILL it after ``timeout`` s (then False)."""
        if self.process is None:
            return True
        try:
            self.process.wait(timeout)
        except subprocess.TimeoutExpired:
            self.process.send_signal(signal.SIGCONT)
            self.process.kill()
            self.process.wait(10)
            return False
        return True


def check_overrides(overrides: Mapping[str, str], settings: Mapping[str, str]) -> None:
    """End the run before any member starts if ``overrides`` (``--set``) would make a
    member's config invalid, with the config's own message naming the key."""
    owned = sorted(set(overrides) & RUNNER_KEYS)
    if owned:
        raise SystemExit(f"chaos run: --set {', '.join(owned)}: set by the runner itself")
    try:
        # two layers, so that a rule between keys names who set each ("ClusterMembers
        # (from the runner)", not "(from --set)": it was never given)
        build_config([Layer("the runner", settings), Layer("--set", overrides)])
    except ConfigError as exc:
        raise SystemExit(f"chaos run: {exc}") from exc


def build_members(
    *,
    count: int,
    seeds: int,
    base: int,
    proxies: bool,
    out: Path,
    env: dict[str, str],
    on_crash: Callable[[Member, int], None],
    mqtt: bool = False,
    mode: str = "Guaranteed",
) -> tuple[list[Member], dict[int, list[Proxy]], list[str]]:
    """The members of a cluster of ``mode`` (``ClusterDeliveryMode``: Guaranteed or
    Standard) on ports from ``base`` (not started), their
    proxies by member index (cluster, Raft (unused in Standard), client; none without
    ``proxies``) and the
    client URL of each member (its client proxy's when proxied). ``on_crash``: see
    :class:`Member`.

    Member i serves clients and HTTP on base+10i and is known to its peers at
    base+1000+10i (Raft + 1). Proxied, it binds its cluster links on base+2000+10i and
    clients reach it through base+3000+10i. With ``mqtt``, its MQTT listener is on
    :data:`MQTT_OFFSET` past its client port, and so is the MQTT port clients reach (a
    fourth proxy, a client link for the nemesis: :func:`mqtt_port`).
    """
    members: list[Member] = []
    proxy_of: dict[int, list[Proxy]] = {}
    client_urls: list[str] = []
    for i in range(count):
        s = member_settings(
            i,
            members=count,
            seeds=seeds,
            mode=mode,
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
            if mqtt:
                mq = MQTT_OFFSET
                proxy_of[i].append(Proxy(f"{member(i)}/mqtt", public + mq, client_port + mq))
        if mqtt:
            s["ListenMqtt"] = f"127.0.0.1:{client_port + MQTT_OFFSET}"
        client_urls.append(f"ws://127.0.0.1:{public}")
        members.append(
            Member(
                i, s, client_port, client_port, out / "logs" / f"{member(i)}.log", env, on_crash
            )
        )
    return members, proxy_of, client_urls


Built = tuple[list[Member], dict[int, list[Proxy]], list[str]]
PORT_TRIES = 50


def ports_bound(members: list[Member], proxy_of: Mapping[int, list[Proxy]]) -> list[int]:
    """Every port of 127.0.0.1 the run will bind, read from what binds it: each member's
    listeners as its config reads them (clients, TLS, MQTT, monitoring), its cluster
    link port and its Raft port (+ 1), and every proxy's listening port."""
    ports: list[int] = []
    for m in members:
        config = Config.from_mapping(m.settings, source=m.name)
        for addresses in (config.listen, config.listen_encrypted, config.listen_mqtt,
                          config.listen_mqtt_encrypted):
            ports += [port for _, port in addresses]
        if config.monitor_listen is not None:
            ports.append(config.monitor_listen[1])
        link = config.cluster_member_bind or config.cluster_member_listen
        if link is not None:
            ports += [link[1], link[1] + 1]
    ports += [proxy.listen_port for proxies in proxy_of.values() for proxy in proxies]
    return [port for port in ports if port != 0]


def on_free_ports(
    pick_base: Callable[[], int],
    build: Callable[[int], Built],
    settings: Mapping[str, str],
    overrides: Mapping[str, str],
) -> tuple[int, Built]:
    """The base port and the members built on it (``settings``, then ``overrides``
    (``--set``) given to each) once every port in :func:`ports_bound` is free: a base is
    picked for the ports of its own formula (``cluster.tooling``), and a member binds
    more (its MQTT port, ``--set`` listeners). A port two members would bind ends the
    command."""
    for _ in range(PORT_TRIES):
        base = pick_base()
        built = build(base)
        members, proxy_of, _ = built
        for m in members:
            m.settings.update(settings)
        check_overrides(overrides, members[0].settings)
        for m in members:
            m.settings.update(overrides)
        ports = ports_bound(members, proxy_of)
        twice = sorted({port for port in ports if ports.count(port) > 1})
        if twice:
            raise SystemExit(f"chaos run: port {', '.join(map(str, twice))} would be bound "
                             "by two members or proxies (a --set listener with a fixed port?)")
        if all(port_free(port) for port in ports):
            return base, built
    raise SystemExit(f"chaos run: no base port with every port free in {PORT_TRIES} tries")


def mqtt_port(client_url: str) -> int:
    """The MQTT port clients reach the member of ``client_url`` on (runs with MQTT)."""
    return int(client_url.rsplit(":", 1)[1]) + MQTT_OFFSET


def http_json(port: int, path: str, timeout: float = 0.6) -> tuple[int, Any]:
    """(status, body): the JSON body for ``/cluster`` only; status 0 if unreachable."""
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=timeout) as r:
            return r.status, json.loads(r.read() or b"null") if path == "/cluster" else None
    except urllib.error.HTTPError as exc:
        return exc.code, None
    except (OSError, ValueError):
        return 0, None


def base_port(members: int) -> int:
    """A free base port whose every port (up to base + 3000 + 10 * members) lies below the
    kernel's ephemeral range, so that no outgoing connection on the box takes one of
    them between this choice and the members' start."""
    try:
        with open("/proc/sys/net/ipv4/ip_local_port_range") as f:
            ephemeral = int(f.read().split()[0])
    except (OSError, ValueError, IndexError):
        ephemeral = 32768
    rng = random.Random()
    base = free_base_port(members, rng)
    for _ in range(100):
        if base + 3000 + 10 * members + 2 < ephemeral:
            break
        base = free_base_port(members, rng)
    return base


def stop_members(members: list[Member]) -> None:
    """The final stop: crashes so far recorded, then every member ended by PID."""
    for m in members:
        m.check_exit()
        m.signal(signal.SIGCONT)
        m.signal(signal.SIGTERM)
    deadline = time.monotonic() + 10
    for m in members:
        p = m.process
        if p is None:
            continue
        try:
            p.wait(max(0.1, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait(10)
