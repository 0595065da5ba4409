"""``migratory cluster up`` and ``cluster status`` as people use them: real processes.

Every ``cluster up`` here runs from a temporary directory on free ports and is stopped
by PID; the tests then check that none of its members is left running.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from cluster_fixture import LocalCluster

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "server"))
from rawclient import RawClient

from cluster.status_table import read_state
from cluster.tooling import free_base_port
from migratory.model.message import Message
from migratory.protocol import ops

SUBJECT = "/Cluster/Up/Retained"


def clean_env() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if not k.startswith("MIGRATORY_CFG_")}


# the console script users run (``cluster.cli:main``), installed next to the interpreter
MIGRATORY = str(Path(sys.executable).with_name("migratory"))


def migratory(
    *args: str, cwd: Path, timeout: float = 60, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    """``env``: more environment variables."""
    return subprocess.run(
        [MIGRATORY, *args],
        cwd=cwd, env={**clean_env(), **(env or {})}, capture_output=True, text=True,
        timeout=timeout,
    )


def command_line(pid: int) -> str:
    """What ``ps`` shows every user of the machine."""
    return subprocess.run(
        ["ps", "-ww", "-o", "args=", "-p", str(pid)], capture_output=True, text=True, check=True
    ).stdout


def environment(pid: int) -> dict[str, str]:
    raw = Path(f"/proc/{pid}/environ").read_bytes()
    return dict(item.split("=", 1) for item in raw.decode().split("\0") if "=" in item)


def members_started_in(cwd: Path) -> list[int]:
    """PIDs of live member processes started from ``cwd`` (where ``cluster up`` ran)."""
    found = []
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            cmdline = (proc / "cmdline").read_bytes().split(b"\0")
            where = (proc / "cwd").resolve()
        except OSError:
            continue
        if b"serve" in cmdline and where == cwd.resolve() and alive(int(proc.name)):
            found.append(int(proc.name))
    return found


def alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


class ClusterUp:
    """One ``migratory cluster up`` process in ``cwd``."""

    def __init__(self, cwd: Path, base: int, *args: str) -> None:
        self.cwd, self.base = cwd, base
        self.member_pids: list[int] = []
        self.out = (cwd / "up.out").open("w")
        self.err = (cwd / "up.err").open("w")
        self.process = subprocess.Popen(
            [MIGRATORY, "cluster", "up", "--base-port", str(base),
             "--log-dir", "logs", *args],
            cwd=cwd, env=clean_env(), stdout=self.out, stderr=self.err,
        )

    def wait_ready(self, timeout: float = 60) -> list[dict[str, Any]]:
        """The members the banner listed, once it is printed."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise AssertionError(f"cluster up exited {self.process.returncode}: "
                                     f"{self.stdout()}{self.stderr()}")
            if "servers for clients:" in self.stdout():
                members = read_state(self.cwd / ".migratory-cluster.json")
                self.member_pids = [int(m["pid"]) for m in members]
                return members
            time.sleep(0.1)
        raise AssertionError(f"no banner in {timeout} s: {self.stdout()}{self.stderr()}")

    def stop(self, sig: int, timeout: float = 30) -> int:
        self.process.send_signal(sig)
        code = self.process.wait(timeout)
        self.out.close()
        self.err.close()
        return code

    def stdout(self) -> str:
        return (self.cwd / "up.out").read_text()

    def stderr(self) -> str:
        return (self.cwd / "up.err").read_text()

    def kill(self) -> None:
        if self.process.poll() is None:
            self.process.kill()
            self.process.wait(10)


StartUp = Callable[..., ClusterUp]


@pytest.fixture
def cluster_up(tmp_path: Path) -> Iterator[StartUp]:
    """``cluster_up(*args, base=PORT)`` starts ``cluster up``; whatever is left at the end
    (the command or one of its members) is killed by PID."""
    started: list[ClusterUp] = []

    def start(*args: str, base: int) -> ClusterUp:
        up = ClusterUp(tmp_path, base, *args)
        started.append(up)
        return up

    yield start
    for up in started:
        up.kill()
        for pid in up.member_pids:
            if alive(pid):
                os.kill(pid, signal.SIGKILL)


def publish_retained(port: int, content: bytes) -> ops.PublishStatus:
    client = RawClient(port, timeout=10)
    try:
        client.connect("cluster-up-test")
        return client.publish(Message(SUBJECT, content, retained=True, closure="1"))
    finally:
        client.close()


def snapshot(port: int) -> bytes | None:
    url = f"http://127.0.0.1:{port}/snapshot?subject={SUBJECT}"
    try:
        with urllib.request.urlopen(url, timeout=5) as reply:
            content: bytes = reply.read()
            return content
    except urllib.error.HTTPError as exc:
        assert exc.code == 404, exc
        return None


def test_cluster_up_serves_shows_status_and_stops_every_member_on_sigterm(
    tmp_path: Path, cluster_up: StartUp
) -> None:
    password = "pw-" + os.urandom(8).hex()
    secret = tmp_path / "cluster-password"
    secret.write_text(password + "\n")
    secret.chmod(0o600)
    base = free_base_port(3)
    up = cluster_up("--password-file", str(secret), base=base)
    members = up.wait_ready()
    assert [m["name"] for m in members] == ["migratory-0", "migratory-1", "migratory-2"]

    # the password is on no command line, and it is what the members run with
    pids = [up.process.pid] + [int(m["pid"]) for m in members]
    for pid in pids:
        shown = command_line(pid)
        assert "migratory" in shown, shown  # it is the right process
        assert password not in shown and "ClusterPassword" not in shown, shown
    for pid in pids[1:]:
        assert environment(pid)["MIGRATORY_CFG_CLUSTERPASSWORD"] == password

    # the cluster links run over mutual TLS, with a CA and certificates made for this run
    tls = (tmp_path / "logs" / "cluster-tls").resolve()
    keys = sorted(tls.glob("*-key.pem"))
    assert len(keys) == 3 and all(key.stat().st_mode & 0o077 == 0 for key in keys), keys
    for pid in pids[1:]:
        assert f"ClusterTlsCa={tls / 'ca.pem'}" in command_line(pid)

    status = publish_retained(base, b"first")
    assert status.status is ops.Status.PUBLISH_OK, status

    table = migratory("cluster", "status", cwd=tmp_path)
    assert table.returncode == 0, table.stderr
    rows = {line.split()[0]: line.split() for line in table.stdout.splitlines()[1:]}
    assert set(rows) == {"migratory-0", "migratory-1", "migratory-2"}, table.stdout
    for name, member in zip(sorted(rows), members, strict=True):
        assert member["client_url"] in rows[name], table.stdout
        assert rows[name][2] == "yes", table.stdout
    leaders = {cells[4] for cells in rows.values()}
    (leader,) = [name for name, cells in rows.items() if cells[3] == "leader"]
    assert leaders == {leader}, table.stdout  # every member names the leader: migratory-N

    assert sorted(members_started_in(tmp_path)) == sorted(pids[1:])  # what the check sees
    assert up.stop(signal.SIGTERM) == 0, up.stderr()
    assert not [pid for pid in pids if alive(pid)]
    assert not members_started_in(tmp_path)
    assert not (tmp_path / ".migratory-cluster.json").exists()
    assert "Traceback" not in up.stderr()


def test_data_survives_a_restart_and_fresh_starts_empty(
    tmp_path: Path, cluster_up: StartUp
) -> None:
    base = free_base_port(3)
    up = cluster_up(base=base)
    up.wait_ready()
    assert publish_retained(base + 10, b"kept").status is ops.Status.PUBLISH_OK
    assert up.stop(signal.SIGINT) == 0, up.stderr()

    up = cluster_up(base=base)
    up.wait_ready()
    assert snapshot(base) == b"kept"  # the control: without --fresh the data is back
    assert up.stop(signal.SIGTERM) == 0

    up = cluster_up("--fresh", base=base)
    up.wait_ready()
    assert snapshot(base) is None
    assert snapshot(base + 20) is None
    assert up.stop(signal.SIGTERM) == 0


@pytest.mark.parametrize("port_of_member_1", ["client", "cluster", "raft"])
def test_a_port_in_use_is_reported_before_anything_starts(
    tmp_path: Path, port_of_member_1: str
) -> None:
    base = free_base_port(3)
    port = {"client": base + 10, "cluster": base + 1010, "raft": base + 1011}[port_of_member_1]
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", port))
        holder.listen()
        result = migratory("cluster", "up", "--base-port", str(base), "--log-dir", "logs",
                           cwd=tmp_path)
    assert result.returncode != 0
    assert f"port {port}" in result.stderr and "migratory-1" in result.stderr, result.stderr
    assert "Traceback" not in result.stderr
    assert "servers for clients" not in result.stdout
    assert not members_started_in(tmp_path)


def test_a_member_that_fails_to_start_stops_the_others(tmp_path: Path) -> None:
    base = free_base_port(3)
    data = tmp_path / "logs" / "data"
    data.mkdir(parents=True)
    (data / "migratory-1").write_text("not a directory")
    result = migratory("cluster", "up", "--base-port", str(base), "--log-dir", "logs",
                       cwd=tmp_path, timeout=60)
    assert result.returncode == 1, result.stderr
    assert "migratory-1" in result.stderr and "ClusterDataDir" in result.stderr, result.stderr
    assert "Traceback" not in result.stderr
    assert "servers for clients" not in result.stdout
    assert not members_started_in(tmp_path)


@pytest.mark.parametrize(
    ("args", "named"),
    [
        (["--members", "3", "--seeds", "5"], "--seeds 5"),
        (["--members", "5", "--seeds", "4"], "--seeds 4"),
        (["--mode", "standard", "--seeds", "3"], "--seeds"),
        (["--members", "2"], "--members 2"),
    ],
)
def test_an_impossible_cluster_is_refused_before_anything_starts(
    tmp_path: Path, args: list[str], named: str
) -> None:
    base = free_base_port(5)
    result = migratory("cluster", "up", "--base-port", str(base), *args, cwd=tmp_path)
    assert result.returncode == 2
    assert named in result.stderr, result.stderr
    assert "Traceback" not in result.stderr and result.stdout == ""
    assert not members_started_in(tmp_path)


@pytest.mark.parametrize(
    ("variable", "named"),
    [
        ("MIGRATORY_CFG_WORKERS=2", "Workers (from environment variable MIGRATORY_CFG_WORKERS)"
         " = 2 with ClusterMembers"),
        ("MIGRATORY_CFG_MAXCACHEDMESSAGESPERSUBJECT=many", "MaxCachedMessagesPerSubject"),
    ],
)
def test_a_setting_in_the_environment_the_members_cannot_take_is_refused_before_they_start(
    tmp_path: Path, variable: str, named: str
) -> None:
    """The members get ``cluster up``'s environment, so its check reads it too: it read
    none, started every member and stopped them when one failed on it (exit 1)."""
    key, value = variable.split("=")
    base = free_base_port(3)
    result = migratory("cluster", "up", "--base-port", str(base), "--members", "3",
                       cwd=tmp_path, env={key: value})
    assert result.returncode == 2, result.stderr
    assert named in result.stderr, result.stderr
    assert "Traceback" not in result.stderr and result.stdout == ""
    assert not list(tmp_path.glob("cluster-logs/migratory-*.log"))  # no member started


def test_status_shows_why_a_member_is_not_ready(tmp_path: Path) -> None:
    cluster = LocalCluster(tmp_path, members=3)
    cluster.start(0)  # a seed alone: no Raft majority, never ready
    try:
        deadline = time.monotonic() + 30
        reason = None
        while reason is None and time.monotonic() < deadline:
            try:
                reason = cluster.status(0).get("not_ready_reason")
            except OSError:
                time.sleep(0.1)
        assert reason, "a lone seed should say why it is not ready"
        table = migratory("cluster", "status", "--server", cluster.url(0), cwd=tmp_path)
        after = cluster.status(0).get("not_ready_reason")  # the reason may move on meanwhile
    finally:
        cluster.stop()
    (row,) = table.stdout.splitlines()[1:]
    assert row.split()[:3] == ["migratory-0", "seed", "no"], table.stdout
    assert cluster.url(0) in row, table.stdout
    assert f"not ready: {reason}" in row or f"not ready: {after}" in row, table.stdout


def test_a_seed_left_alone_is_not_ready_and_says_why(tmp_path: Path) -> None:
    """pysyncobj keeps the leader it last saw while connected to no one: the member must
    not take that for a leader."""
    cluster = LocalCluster(tmp_path, members=3)
    cluster.start_all()
    try:
        cluster.wait_ready()
        leader = cluster.leader()
        alone = next(i for i in range(3) if i != leader)
        for i in range(3):
            if i != alone:
                cluster.kill(i)
        deadline = time.monotonic() + 10
        while cluster.ready(alone) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert not cluster.ready(alone), "a seed without its two peers is still ready"
        reason = cluster.status(alone).get("not_ready_reason")
        table = migratory("cluster", "status", "--server", cluster.url(alone), cwd=tmp_path)
    finally:
        cluster.stop()
    (row,) = table.stdout.splitlines()[1:]
    assert row.split()[:5] == [f"migratory-{alone}", "seed", "no", "follower", "-"], row
    assert f"not ready: {reason}" in row, row
