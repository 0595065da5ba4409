"""What ``cluster up`` checks before it starts anything, and the ``cluster status`` table,
without processes."""

from __future__ import annotations

import argparse
import random
import socket
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from cluster import tooling
from cluster.status_table import format_status_table
from cluster.tooling import (
    PORT_SLICE_ENV,
    _member_ports,
    free_base_port,
    member_command,
    member_settings,
)
from cluster.up_checks import (
    PASSWORD_ENV,
    StartFailed,
    check_configs,
    check_ports,
    check_request,
    clear_data,
    read_password,
)


def up_args(**kw: Any) -> argparse.Namespace:
    values = {"members": 3, "seeds": None, "mode": "guaranteed", "password_file": None,
              "base_port": 8800, "start_timeout": 60.0}
    return argparse.Namespace(**{**values, **kw})


def settings(members: int = 3, base: int = 8800, password: str = "pw") -> list[dict[str, str]]:
    return [
        member_settings(i, members=members, seeds=3, mode="Guaranteed", base_port=base,
                        password=password, data_dir=Path("data"))
        for i in range(members)
    ]


def test_seed_count_defaults_as_the_config_does() -> None:
    assert check_request(up_args(members=4)) == ("Guaranteed", 3)
    assert check_request(up_args(members=5)) == ("Guaranteed", 5)
    assert check_request(up_args(members=5, seeds=3)) == ("Guaranteed", 3)
    assert check_request(up_args(mode="standard", members=2)) == ("Standard", 0)


@pytest.mark.parametrize(
    ("kw", "named"),
    [
        ({"members": 3, "seeds": 5}, "--seeds 5"),
        ({"members": 6, "seeds": 4}, "--seeds 4"),
        ({"members": 2}, "--members 2"),
        ({"members": 0, "mode": "standard"}, "--members 0"),
        ({"mode": "standard", "seeds": 3}, "--seeds"),
        # Before: --members 100000 built 100,000 member lists of 100,000 addresses (and a
        # certificate each) until the kernel's OOM killer ended it, 11 minutes later, a
        # SIGTERM only noted meanwhile; --base-port 70000 was refused as member 0's
        # "Listen: must be >= 0 and <= 65535" (not the option), --start-timeout -1 waited
        # for nothing and said "not ready after -1 s" with the members just started
        ({"members": 100_000}, "--members 100000: at most 1,000"),
        ({"members": 5, "base_port": 70_000}, "--base-port 70000 with --members 5: .* to 71041"),
        ({"members": 5, "base_port": 64_600}, "--base-port 64600 with --members 5: .* to 65641"),
        ({"base_port": 0}, "--base-port 0 with --members 3"),
        ({"start_timeout": -1.0}, "--start-timeout -1.0: must be more than 0"),
    ],
)
def test_an_impossible_request_names_the_option(kw: dict[str, Any], named: str) -> None:
    with pytest.raises(StartFailed, match=named):
        check_request(up_args(**kw))


def test_password_file_must_be_private(tmp_path: Path) -> None:
    secret = tmp_path / "pw"
    secret.write_text("s3cret\n")
    secret.chmod(0o640)
    with pytest.raises(StartFailed, match="mode 0640"):
        read_password(up_args(password_file=str(secret)))
    secret.chmod(0o600)
    assert read_password(up_args(password_file=str(secret))) == "s3cret"
    secret.write_text("\n")
    with pytest.raises(StartFailed, match="empty"):
        read_password(up_args(password_file=str(secret)))


def test_password_from_the_environment_or_random(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(PASSWORD_ENV, "from-env")
    assert read_password(up_args()) == "from-env"
    monkeypatch.delenv(PASSWORD_ENV)
    first, second = read_password(up_args()), read_password(up_args())
    assert len(first) >= 20 and first != second


def test_the_password_goes_in_the_environment_not_argv() -> None:
    args, env = member_command(settings(password="hunter2")[0])
    assert not any("hunter2" in a or "ClusterPassword" in a for a in args)
    assert env[PASSWORD_ENV] == "hunter2"
    assert "ClusterMemberListen=127.0.0.1:9800" in args


def test_each_member_config_is_checked_as_the_member_would() -> None:
    check_configs(settings(), environ={})
    broken = settings()
    broken[2]["ClusterMemberListen"] = "127.0.0.1:1"
    with pytest.raises(StartFailed, match="migratory-2: configuration error: ClusterMemberListen"):
        check_configs(broken, environ={})
    with pytest.raises(StartFailed, match="migratory-0: configuration error: Workers "
                       r"\(from environment variable MIGRATORY_CFG_WORKERS\) = 2"):
        check_configs(settings(), environ={"MIGRATORY_CFG_WORKERS": "2"})


@pytest.mark.parametrize(("offset", "use"), [(20, "clients"), (1020, "cluster"), (1021, "Raft")])
def test_a_port_in_use_is_named_with_its_member_and_use(offset: int, use: str) -> None:
    base = free_base_port(3)
    check_ports(settings(base=base))
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", base + offset))
        holder.listen()
        with pytest.raises(StartFailed, match=f"port {base + offset} \\(migratory-2's {use}"):
            check_ports(settings(base=base))


def test_a_non_seed_needs_no_raft_port() -> None:
    base = free_base_port(4)
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", base + 1031))  # member 3's cluster port + 1
        holder.listen()
        check_ports(settings(members=4, base=base))


def test_fresh_removes_only_the_members_data(tmp_path: Path) -> None:
    (tmp_path / "migratory-0" / "x").mkdir(parents=True)
    (tmp_path / "migratory-0" / "x" / "raft.journal").write_bytes(b"log")
    (tmp_path / "notes").mkdir()
    clear_data(tmp_path)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["notes"]
    clear_data(tmp_path / "missing")  # nothing there yet: nothing to do


def seed(index: int, leader: int | None, **kw: Any) -> dict[str, Any]:
    return {
        "member": f"127.0.0.1:{9800 + 10 * index}",
        "index": index,
        "role": "seed",
        "ready": True,
        "not_ready_reason": None,
        "applied_clsn": 7,
        "raft_address": f"127.0.0.1:{9801 + 10 * index}",
        "raft_state": "leader" if leader == index else "follower",
        "raft_leader": None if leader is None else f"127.0.0.1:{9801 + 10 * leader}",
        **kw,
    }


def test_status_names_the_leader_and_shows_urls_and_reasons() -> None:
    rows = [
        ("migratory-0", "ws://h:8800", "127.0.0.1:9800", seed(0, 2), {"subjects": 3}),
        ("migratory-1", "ws://h:8810", "127.0.0.1:9810", {"error": "refused"}, {}),
        ("migratory-2", "ws://h:8820", "127.0.0.1:9820", seed(2, 2), {"subjects": 3}),
        ("migratory-3", "ws://h:8830", "127.0.0.1:9830",
         {"index": 3, "role": "non-seed", "ready": False, "applied_clsn": 0,
          "not_ready_reason": "member is syncing its cache"}, {}),
    ]
    header, *lines = format_status_table(rows)
    assert header.split() == ["member", "role", "ready", "raft", "leader", "clsn", "client", "URL"]
    assert lines[0].split()[:7] == ["migratory-0", "seed", "yes", "follower", "migratory-2", "7",
                                    "ws://h:8800"]
    assert lines[1].split()[:2] == ["migratory-1", "DOWN"] and "(refused)" in lines[1]
    assert lines[2].split()[3:5] == ["leader", "migratory-2"]
    assert lines[3].split()[:3] == ["migratory-3", "non-seed", "no"]
    assert lines[3].endswith("not ready: member is syncing its cache")


def test_status_without_a_state_file_names_members_by_index() -> None:
    rows = [(None, f"ws://h:88{i}0", None, seed(i, 1), {}) for i in (0, 1)]
    lines = format_status_table(rows)[1:]
    assert [line.split()[0] for line in lines] == ["migratory-0", "migratory-1"]
    assert {line.split()[4] for line in lines} == {"migratory-1"}
    # a leader that is not among the members asked is shown by its Raft address
    rows = [(None, "ws://h:8800", None, seed(0, 2), {})]
    assert format_status_table(rows)[1].split()[4] == "127.0.0.1:9821"


def test_a_base_port_whose_mqtt_port_is_held_is_not_chosen() -> None:
    """A loopback cluster's member may listen for MQTT on its client port + 5 (the chaos
    runner, test_cluster_mqtt_resume.py): the base port's formula checks it too."""
    first = free_base_port(3, random.Random(7))  # the candidate a Random(7) draws first
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", first + 10 + 5))  # member 1's MQTT port
        holder.listen()
        assert free_base_port(3, random.Random(7)) != first


@pytest.mark.parametrize("members", [1, 3, 5, 8])
def test_workers_in_their_own_port_slices_never_pick_a_port_of_another(
    monkeypatch: pytest.MonkeyPatch, members: int
) -> None:
    """Each pytest worker picks from its slice (``MIGRATORY_BASE_PORT_SLICE``): the
    ports of any base one slice picks are never the ports of a base another picks (the
    test of ``cluster up`` failed on a port another worker's cluster had taken). The
    slices' arithmetic is what is checked: every port reads free here (CI B of 205c71a,
    the cluster lane busy beside it, found no free base for 8 members in 2,000 draws)."""
    monkeypatch.setattr(tooling, "port_free", lambda port, **_: True)
    taken: list[set[int]] = []
    for k in range(3):
        monkeypatch.setenv(PORT_SLICE_ENV, f"{k}/3")
        rng = random.Random(k)
        bases = {free_base_port(members, rng) for _ in range(40)}
        taken.append({p for base in bases for i in range(members)
                      for p in _member_ports(base, i)})
    assert all(taken)
    for a in range(3):
        for b in range(a + 1, 3):
            assert taken[a].isdisjoint(taken[b]), (a, b, sorted(taken[a] & taken[b])[:5])
    monkeypatch.delenv(PORT_SLICE_ENV)
    spread = {free_base_port(members, random.Random(s)) % 1000 // 333 for s in range(60)}
    assert spread == {0, 1, 2}  # the control: without a slice, any base


@pytest.mark.parametrize(("where", "why"), [
    ("{tmp}/none/state.json", "no such directory '{tmp}/none'"),
    ("{tmp}", "is a directory"),
])
def test_a_state_file_it_cannot_write_is_refused_before_any_member_starts(
    tmp_path: Path, where: str, why: str
) -> None:
    """Before: the members started, became ready, then a FileNotFoundError traceback
    (IsADirectoryError) and they were stopped again."""
    state = where.format(tmp=tmp_path)
    done = subprocess.run(
        [str(Path(sys.executable).with_name("migratory")), "cluster", "up", "--state", state,
         "--log-dir", str(tmp_path / "logs")],
        capture_output=True, text=True, timeout=60,
    )
    assert (done.returncode, done.stderr) == (
        2, f"migratory cluster up: --state {state}: {why.format(tmp=tmp_path)}\n")
    assert not (tmp_path / "logs").exists()  # nothing was started
