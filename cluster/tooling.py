"""``migratory cluster up`` and ``migratory cluster status``: a local cluster of processes.

``cluster up`` checks everything it can before it starts a process (the seed count,
each member's configuration, every port a member will bind), starts the members,
waits until each one accepts clients, and only then prints the banner. A member that
fails to start, or that is not ready in time, stops the others and the command exits 1
with the member's own words; nothing is left running. SIGINT, SIGTERM and SIGHUP stop
every member. The cluster password never appears on a command line (``ps`` shows those
to every user): it comes from ``MIGRATORY_CFG_CLUSTERPASSWORD`` or a ``--password-file``
of mode 0600 (else a random one) and reaches each member in its environment.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from types import FrameType
from typing import Any, Protocol

from cluster.status_table import member_url, run_status
from cluster.up_checks import (
    PASSWORD_ENV,
    StartFailed,
    check_configs,
    check_ports,
    check_request,
    check_state_file,
    clear_data,
    port_free,
    read_password,
)
from migratory.certificates import make_cluster_certificates

DEFAULT_STATE = ".migratory-cluster.json"
STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)


@dataclass(frozen=True, slots=True)
class LocalMember:
    name: str  # migratory-0, migratory-1, ... as StatefulSet pods are named
    client_url: str
    http_url: str
    cluster_address: str
    pid: int


class StopRequested(Exception):
    """A stop signal (SIGTERM, SIGHUP) arrived; SIGINT is ``KeyboardInterrupt``."""


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
    """The config of member ``index`` of a loopback cluster; its Raft state (Guaranteed)
    or the record of its lives (Standard: a drained member's next life then costs its
    peers' subscribers no DATA_RESYNC) goes in ``data_dir/migratory-INDEX``."""
    cluster = [f"127.0.0.1:{base_port + 1000 + 10 * i}" for i in range(members)]
    return {
        "ServerName": f"migratory-{index}",
        "Listen": f"127.0.0.1:{base_port + 10 * index}",
        "ClusterMembers": ", ".join(cluster),
        "ClusterMemberListen": cluster[index],
        "ClusterSeedMemberCount": str(seeds) if mode == "Guaranteed" else "",
        "ClusterDeliveryMode": mode,
        "ClusterPassword": password,
        "ClusterDataDir": str(data_dir / f"migratory-{index}"),
        # no cluster DNS to wait for on loopback (cluster/seed_link_wait.py): a seed
        # restarted while another is down would be not ready 35 s
        "ClusterSeedLinkWait": "0",
    }


MQTT_OFFSET = 5
"""A member's MQTT listener, when a loopback cluster has one: its client port + 5 (the
chaos runner's, tests/cluster/test_cluster_mqtt_resume.py)."""


def _member_ports(base_port: int, index: int) -> list[int]:
    """Every port member ``index`` of a loopback cluster may use: clients and HTTP on
    base+10i (MQTT on + 5), cluster links on base+1000+10i and Raft on that + 1; behind
    the chaos runner's proxies the member really binds base+2000+10i (+ 1 for Raft) and
    clients reach it on base+3000+10i (+ 1 kept free as well, MQTT on + 5)."""
    client = base_port + 10 * index
    ports = [client] + [client + offset + d for offset in (1000, 2000, 3000) for d in (0, 1)]
    return [*ports, client + MQTT_OFFSET, client + 3000 + MQTT_OFFSET]


def ephemeral_low() -> int:
    """The first port of the kernel's range for outgoing connections' local ports."""
    try:
        with open("/proc/sys/net/ipv4/ip_local_port_range") as ports:
            return int(ports.read().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768  # Linux's default


PORT_SLICE_ENV = "MIGRATORY_BASE_PORT_SLICE"
"""``K/N``: :func:`free_base_port` picks only bases whose ports no other slice of ``N``
uses (test runs side by side: each xdist worker sets its own, ``tests/conftest.py``).
Two runs that each found a base free could pick bases whose ports overlap (a member's
ports are spread over base..base+3000), and the second to bind failed."""


def _in_slice(base: int, members: int, slice_spec: str | None) -> bool:
    """Whether every port of ``base`` (``_member_ports``, taken modulo 1000) falls inside
    the slice's share of each thousand: slices of one ``N`` never share a port."""
    if not slice_spec:
        return True
    index, _, count = slice_spec.partition("/")
    try:
        k, n = int(index), int(count)
    except ValueError:
        return True
    width = 1000 // max(n, 1)
    room = width - 10 * members - 10  # the last member's ports: + 10(members - 1) + 6
    if n <= 1 or room <= 0 or not 0 <= k < n:
        return True
    return k * width <= base % 1000 < k * width + room


def free_base_port(members: int, rng: random.Random | None = None) -> int:
    """A base port (a multiple of 10 from 20000) whose ``_member_ports`` are all free on
    127.0.0.1 for ``members`` members, all below the ephemeral range: a port found free
    there could be taken by any outgoing connection before the member binds it (a
    member failed with "Address already in use" at a test's start); ``rng`` defaults
    to the module's. Under :data:`PORT_SLICE_ENV`, only bases of that slice."""
    randrange = rng.randrange if rng is not None else random.randrange
    top = ephemeral_low() - 3010 - 10 * members
    if top <= 21_000:  # an ephemeral range that starts low: the old range, and the race
        top = 40_000
    slice_spec = os.environ.get(PORT_SLICE_ENV)
    for _ in range(2000):
        base = randrange(20_000, top, 10)
        if not _in_slice(base, members, slice_spec):
            continue
        if all(port_free(p) for i in range(members) for p in _member_ports(base, i)):
            return base
    raise RuntimeError("no free ports")


def member_command(settings: dict[str, str]) -> tuple[list[str], dict[str, str]]:
    """The argv and environment of a member process: every setting is a ``--set`` except
    ``ClusterPassword``, which goes in the environment (argv is visible to every user)."""
    args = [sys.executable, "-m", "cluster", "serve"]
    env = dict(os.environ)
    for key, value in settings.items():
        if key == "ClusterPassword":
            env[PASSWORD_ENV] = value
        else:
            args += ["--set", f"{key}={value}"]
    return args, env


def start_member(settings: dict[str, str], log_path: Path) -> subprocess.Popen[bytes]:
    args, env = member_command(settings)
    with log_path.open("ab") as log:
        return subprocess.Popen(
            args, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=log, env=env
        )


class Stoppable(Protocol):
    """What :func:`stop_all` uses of a process (a Popen; the tests' forked members)."""

    def poll(self) -> int | None: ...
    def send_signal(self, sig: int, /) -> None: ...
    def wait(self, timeout: float | None = None) -> int: ...
    def kill(self) -> None: ...


def stop_all(processes: Sequence[Stoppable], timeout: float = 10.0) -> None:
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


# --- cluster up: processes --------------------------------------------------------------


class StopSignals:
    """While installed, SIGINT, SIGTERM and SIGHUP only take note (nothing is interrupted,
    so stopping the members cannot be cut short by a second signal); the waiting loops
    call :meth:`check`, which raises :class:`StopRequested`."""

    def __init__(self) -> None:
        self.received: str | None = None
        self._old: dict[int, Any] = {}

    def _note(self, signum: int, _frame: FrameType | None) -> None:
        self.received = self.received or signal.Signals(signum).name

    def install(self) -> None:
        self._old = {sig: signal.signal(sig, self._note) for sig in STOP_SIGNALS}

    def restore(self) -> None:
        for sig, handler in self._old.items():
            signal.signal(sig, handler)

    def check(self) -> None:
        if self.received is not None:
            raise StopRequested(self.received)

    def sleep(self, seconds: float) -> None:
        self.check()
        time.sleep(seconds)
        self.check()


@dataclass(frozen=True, slots=True)
class MemberLog:
    """A member's log file and where this run's part of it starts (logs are appended to
    across runs)."""

    path: Path
    start: int

    @classmethod
    def open(cls, path: Path) -> MemberLog:
        try:
            return cls(path, path.stat().st_size)
        except FileNotFoundError:
            return cls(path, 0)

    def last_words(self) -> str:
        """What the member said last in this run: its ``migratory: ...`` error line, else
        its last line."""
        try:
            with self.path.open("rb") as log:
                log.seek(self.start)
                lines = log.read().decode(errors="replace").strip().splitlines()
        except OSError:
            return ""
        for line in reversed(lines[-50:]):
            if line.startswith("migratory:"):
                return line
        return lines[-1] if lines else f"(nothing in {self.path})"


def exit_status(returncode: int) -> str:
    if returncode < 0:
        return f"killed by {signal.Signals(-returncode).name}"
    return f"exit status {returncode}"


def readiness(http_url: str) -> str | None:
    """None when the member accepts clients, else why not."""
    try:
        with urllib.request.urlopen(f"{http_url}/readyz", timeout=1):
            return None
    except urllib.error.HTTPError as exc:
        return exc.read().decode(errors="replace").strip() or f"HTTP {exc.code}"
    except (OSError, ValueError) as exc:
        return f"not answering ({exc})"


def wait_started(
    members: Sequence[LocalMember],
    processes: Sequence[subprocess.Popen[bytes]],
    logs: Sequence[MemberLog],
    timeout: float,
    stop: StopSignals,
) -> None:
    """Until every member accepts clients; :class:`StartFailed` if one exits first or
    some are still not ready after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    waiting: dict[str, str | None] = {m.name: "starting" for m in members}
    while True:
        for member, process, log in zip(members, processes, logs, strict=True):
            if process.poll() is not None:
                raise StartFailed(
                    f"{member.name} stopped during start-up ({exit_status(process.returncode)})"
                    f": {log.last_words()}"
                )
            if waiting[member.name] is not None:
                waiting[member.name] = readiness(member.http_url)
        if all(reason is None for reason in waiting.values()):
            return
        if time.monotonic() >= deadline:
            late = "; ".join(f"{name}: {why}" for name, why in waiting.items() if why)
            raise StartFailed(f"not ready after {timeout:g} s ({late})")
        stop.sleep(0.1)


def _up(args: argparse.Namespace) -> int:
    processes: list[subprocess.Popen[bytes]] = []
    state = Path(args.state)
    stop = StopSignals()
    stop.install()
    try:
        return _run_cluster(args, processes, state, stop)
    except StartFailed as exc:
        print(f"migratory cluster up: {exc}", file=sys.stderr)
        return 1 if processes else 2
    except StopRequested as exc:
        print(f"\nstopping the cluster ({exc}) ...", flush=True)
        return 0
    finally:
        stop_all(processes)  # a signal now only takes note: this runs to the end
        if processes:
            state.unlink(missing_ok=True)
        stop.restore()


def _run_cluster(
    args: argparse.Namespace,
    processes: list[subprocess.Popen[bytes]],
    state: Path,
    stop: StopSignals,
) -> int:
    mode, seeds = check_request(args)
    check_state_file(state)
    password = read_password(args)
    log_dir = Path(args.log_dir)
    data_dir = log_dir / "data"
    settings = [
        member_settings(
            i, members=args.members, seeds=seeds, mode=mode,
            base_port=args.base_port, password=password, data_dir=data_dir,
        )
        for i in range(args.members)
    ]
    try:
        log_dir.mkdir(parents=True, exist_ok=True)
        if args.cluster_tls:
            hosts = {f"migratory-{i}": ["127.0.0.1"] for i in range(args.members)}
            certificates = make_cluster_certificates((log_dir / "cluster-tls").resolve(), hosts)
            for i, member_config in enumerate(settings):
                member_config.update(certificates[f"migratory-{i}"].settings())
    except OSError as exc:
        raise StartFailed(f"--log-dir {log_dir}: {exc.strerror or exc}") from None
    check_configs(settings)
    check_ports(settings)
    try:
        if args.fresh:
            clear_data(data_dir)
    except OSError as exc:
        raise StartFailed(f"--log-dir {log_dir}: {exc.strerror or exc}") from None
    logs = [MemberLog.open(log_dir / f"migratory-{i}.log") for i in range(args.members)]
    members: list[LocalMember] = []
    for i, config in enumerate(settings):
        stop.check()
        process = start_member(config, logs[i].path)
        processes.append(process)
        members.append(LocalMember(
            f"migratory-{i}", f"ws://{config['Listen']}", f"http://{config['Listen']}",
            config["ClusterMemberListen"], process.pid,
        ))
    what = f"{mode} cluster of {args.members}" + (f" ({seeds} seeds)" if seeds else "")
    print(f"starting a {what} ...", flush=True)
    wait_started(members, processes, logs, args.start_timeout, stop)
    try:
        state.write_text(json.dumps([asdict(m) for m in members], indent=2))
    except OSError as exc:  # (removed meanwhile)
        raise StartFailed(f"--state {state}: {exc.strerror or exc}") from None
    print(f"{what} ready (logs in {log_dir}/):")
    for member in members:
        print(f"  {member.name}  {member.client_url}  cluster {member.cluster_address}"
              f"  pid {member.pid}")
    print("servers for clients: " + " ".join(m.client_url for m in members))
    print("Ctrl-C (or SIGTERM, SIGHUP) stops them all.", flush=True)
    return _watch(members, processes, logs, stop)


def _watch(
    members: Sequence[LocalMember],
    processes: Sequence[subprocess.Popen[bytes]],
    logs: Sequence[MemberLog],
    stop: StopSignals,
) -> int:
    """Report each member that exits (the others go on, e.g. to try a failover by hand);
    return 1 once none is left."""
    reported: set[str] = set()
    while len(reported) < len(members):
        for member, process, log in zip(members, processes, logs, strict=True):
            if process.poll() is not None and member.name not in reported:
                reported.add(member.name)
                print(f"{member.name} (pid {member.pid}) stopped "
                      f"({exit_status(process.returncode)}): {log.last_words()}",
                      file=sys.stderr, flush=True)
        stop.sleep(0.3)
    print("every member has exited", file=sys.stderr)
    return 1


def add_cluster_commands(commands: Any) -> None:
    cluster = commands.add_parser("cluster", help="run or inspect a local cluster")
    sub = cluster.add_subparsers(dest="cluster_command", required=True, metavar="COMMAND")
    up = sub.add_parser(
        "up", help="start a cluster of member processes on 127.0.0.1",
        description="Start a cluster of member processes on 127.0.0.1 and stop them all on "
        "Ctrl-C, SIGTERM or SIGHUP. The cluster password comes from --password-file, else from "
        f"{PASSWORD_ENV}, else it is random; it is never put on a command line.",
    )
    up.add_argument("--members", type=int, default=3, help="members (1 to 1,000)")
    up.add_argument("--seeds", type=int, default=None,
                    help="3 or 5 (default 3 for 3-4 members, 5 for more); Guaranteed only")
    up.add_argument("--mode", choices=("guaranteed", "standard"), default="guaranteed",
                    help="ClusterDeliveryMode")
    up.add_argument("--base-port", type=int, default=8800,
                    help="member i serves clients on base+10*i, cluster links on base+1000+10*i")
    up.add_argument("--state", default=DEFAULT_STATE, help="where to record the members")
    up.add_argument("--log-dir", default="cluster-logs",
                    help="members' logs, and their Raft data in LOG_DIR/data")
    up.add_argument("--fresh", action="store_true",
                    help="start with empty data (remove the members' Raft logs first)")
    up.add_argument("--password-file", metavar="FILE",
                    help="a file (mode 0600) holding the cluster password")
    up.add_argument("--no-cluster-tls", dest="cluster_tls", action="store_false",
                    help="plain TCP cluster links (default: mutual TLS with a new cluster CA "
                    "and member certificates in LOG_DIR/cluster-tls)")
    up.add_argument("--start-timeout", type=float, default=60.0, metavar="SECONDS",
                    help="how long members may take to accept clients")
    up.set_defaults(func=_up)
    status = sub.add_parser("status", help="role, readiness, leader and client URL of each "
                            "member", description="Exit 0 when every member answered and "
                            "is ready, 1 when not, 2 without a state file or --server.")
    status.add_argument("--state", default=DEFAULT_STATE, help="the file `cluster up` wrote")
    status.add_argument("--server", action="append", type=member_url, metavar="URL",
                        help="a member's client URL, ws://HOST:PORT (repeatable)")
    status.set_defaults(func=run_status)
