"""What ``migratory cluster up`` checks before it starts a process: the seed count, the
password's source, each member's configuration (as the member will validate it) and
every port a member will bind. Each refusal names the option or port at fault."""

from __future__ import annotations

import argparse
import os
import secrets
import shutil
import socket
from collections.abc import Mapping, Sequence
from pathlib import Path

from migratory.config import ENV_PREFIX, ConfigError, load_config
from migratory.config_values import MAX_CLUSTER_MEMBERS
from migratory.secret_file import SecretFileError, read_secret_file

PASSWORD_ENV = f"{ENV_PREFIX}CLUSTERPASSWORD"  # how every member gets ClusterPassword


class StartFailed(Exception):
    """``cluster up`` could not start the cluster; the message says why."""


def port_free(port: int, *, reuse_address: bool = False) -> bool:
    """Whether ``port`` can be bound on 127.0.0.1; with ``reuse_address`` as the members
    bind (a port whose old connections linger in TIME_WAIT counts as free)."""
    with socket.socket() as sock:
        if reuse_address:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def read_password(args: argparse.Namespace) -> str:
    """``--password-file`` (mode 0600 or stricter), else ``MIGRATORY_CFG_CLUSTERPASSWORD``,
    else a random password for this run."""
    if args.password_file:
        try:
            return read_secret_file("--password-file", args.password_file)
        except SecretFileError as exc:
            raise StartFailed(str(exc)) from None
    return os.environ.get(PASSWORD_ENV) or secrets.token_urlsafe(18)


def check_request(args: argparse.Namespace) -> tuple[str, int]:
    """The delivery mode and seed count asked for, or :class:`StartFailed` naming the
    option that makes the cluster impossible."""
    if args.members < 1:
        raise StartFailed(f"--members {args.members}: a cluster needs at least one member")
    if args.members > MAX_CLUSTER_MEMBERS:  # (before a list of them is built, certified...)
        raise StartFailed(f"--members {args.members}: at most {MAX_CLUSTER_MEMBERS:,} "
                          "(ClusterMembers' bound)")
    highest = args.base_port + 1000 + 10 * (args.members - 1) + 1  # the last member's Raft
    if args.base_port < 1 or highest > 65535:
        raise StartFailed(
            f"--base-port {args.base_port} with --members {args.members}: the members' "
            f"ports run from {args.base_port} to {highest} (clients on base + 10 x i, cluster "
            "links on base + 1000 + 10 x i, Raft one above), which must be 1 to 65535"
        )
    if not args.start_timeout > 0:
        raise StartFailed(f"--start-timeout {args.start_timeout}: must be more than 0 seconds")
    if args.mode == "standard":
        if args.seeds is not None:
            raise StartFailed("--seeds applies to --mode guaranteed only (Standard mode has "
                              "no seeds)")
        return "Standard", 0
    if args.members < 3:
        raise StartFailed(f"--members {args.members}: Guaranteed mode needs 3 or more members")
    seeds = args.seeds if args.seeds is not None else (3 if args.members <= 4 else 5)
    if seeds not in (3, 5):
        raise StartFailed(f"--seeds {seeds}: a cluster has 3 or 5 seeds")
    if seeds > args.members:
        raise StartFailed(
            f"--seeds {seeds} needs at least {seeds} members, --members is {args.members}"
        )
    return "Guaranteed", seeds


def check_state_file(path: Path) -> None:
    """``--state``: a file ``cluster up`` can write once the members are ready (a
    traceback then, the members just started stopped again, was all a bad one gave)."""
    folder = path.absolute().parent
    if path.is_dir():
        raise StartFailed(f"--state {path}: is a directory")
    if not folder.is_dir():
        raise StartFailed(f"--state {path}: no such directory {str(folder)!r}")
    if not os.access(folder, os.W_OK):
        raise StartFailed(f"--state {path}: {str(folder)!r} is not writable")


def check_configs(
    settings: Sequence[dict[str, str]], environ: Mapping[str, str] | None = None
) -> None:
    """Each member's configuration as the member itself will validate it: its settings
    over ``environ`` (default: this process's environment, which every member inherits,
    ``cluster.tooling.member_command``)."""
    for member in settings:
        try:
            load_config(None, overrides=member, environ=os.environ if environ is None else environ)
        except ConfigError as exc:
            raise StartFailed(f"{member['ServerName']}: configuration error: {exc}") from None


def bound_ports(member: dict[str, str]) -> list[tuple[int, str]]:
    """The ports a member binds on 127.0.0.1, each with what it is for."""
    ports = [(int(member["Listen"].rsplit(":", 1)[1]), "clients and HTTP")]
    cluster_port = int(member["ClusterMemberListen"].rsplit(":", 1)[1])
    ports.append((cluster_port, "cluster link"))
    seeds = int(member["ClusterSeedMemberCount"] or 0)
    index = member["ClusterMembers"].split(", ").index(member["ClusterMemberListen"])
    if index < seeds:
        ports.append((cluster_port + 1, "Raft"))
    return ports


def check_ports(settings: Sequence[dict[str, str]]) -> None:
    for member in settings:
        for port, use in bound_ports(member):
            if not port_free(port, reuse_address=True):
                raise StartFailed(
                    f"port {port} ({member['ServerName']}'s {use}) is already in use on "
                    f"127.0.0.1; stop what holds it or choose another --base-port"
                )


def clear_data(data_dir: Path) -> None:
    """``--fresh``: remove the members' Raft logs (only the ``migratory-N`` directories
    ``cluster up`` made there)."""
    if not data_dir.is_dir():
        return
    for entry in data_dir.iterdir():
        if entry.is_dir() and entry.name.startswith("migratory-"):
            shutil.rmtree(entry)
