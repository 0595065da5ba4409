"""A port ``migratory serve`` cannot listen on stops start-up with one line naming the
address and the key that lists it, exit status 1 (README, "Starting and stopping").

Before: ``cannot listen on 127.0.0.1:P: Address already in use`` named no key (which of
Listen, ListenMqtt, ... the operator must change), and a MonitorListen port in use said
only ``migratory: Address already in use``.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

MIGRATORY = str(Path(sys.executable).with_name("migratory"))


@pytest.fixture
def taken_port() -> Iterator[int]:
    """A port something else listens on."""
    with socket.socket() as other:
        other.bind(("127.0.0.1", 0))
        other.listen()
        yield other.getsockname()[1]


def serve(*settings: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("MIGRATORY_CFG_")}
    args = [MIGRATORY, "serve"]
    for setting in settings:
        args += ["--set", setting]
    # (the 60 s only a guard against a server that starts after all: it would serve)
    return subprocess.run(args, capture_output=True, text=True, env=env, timeout=60)


@pytest.mark.parametrize(("key", "workers"), [
    ("Listen", "1"), ("ListenMqtt", "1"), ("MonitorListen", "1"),
    ("ListenMqtt", "2"),  # the Workers supervisor holds the client ports itself
])
def test_a_port_in_use_is_one_line_naming_the_key(
    taken_port: int, key: str, workers: str
) -> None:
    others = {"Listen": "127.0.0.1:0", "ListenMqtt": "", "MonitorListen": ""}
    others[key] = f"127.0.0.1:{taken_port}"
    done = serve(f"Workers={workers}", *(f"{k}={v}" for k, v in others.items()))
    assert done.returncode == 1, done.stdout
    lines = [line for line in done.stderr.splitlines() if " INFO " not in line]
    assert lines == [
        f"migratory: cannot listen on 127.0.0.1:{taken_port} ({key}): Address already in use"
    ], done.stderr
    assert "listening" not in done.stdout


def test_an_address_not_of_this_host_names_the_key() -> None:
    done = serve("Listen=127.0.0.1:0", "ListenMqtt=192.0.2.1:0")  # TEST-NET-1: never local
    assert done.returncode == 1
    assert ("migratory: cannot listen on 192.0.2.1:0 (ListenMqtt): Cannot assign requested "
            "address") in done.stderr, done.stderr


@pytest.mark.parametrize("workers", ["1", "2"])
@pytest.mark.parametrize(("settings", "message"), [
    (("Entitlement=Token", "EntitlementTokenKeyFile={short}"),
     "Entitlement = Token: EntitlementTokenKeyFile {short}: an HS256 secret must be at "
     "least 32 bytes"),
    (("Entitlement=Custom", "EntitlementPlugin=no_such_module_here:Plugin"),
     "EntitlementPlugin: cannot load 'no_such_module_here:Plugin': ModuleNotFoundError: "
     "No module named 'no_such_module_here'"),
])
def test_a_key_found_bad_while_the_server_is_built_is_a_configuration_error(
    tmp_path: Path, settings: tuple[str, ...], message: str, workers: str
) -> None:
    """A token key file or a plugin is loaded when the server is built, after the keys
    were checked. Before: a ConfigError traceback, exit 1 (with Workers: each worker's
    traceback, then 'worker I stopped during start-up (exit code 1)')."""
    short = tmp_path / "short.key"
    short.write_text("too short")
    done = serve("Listen=127.0.0.1:0", f"Workers={workers}",
                 *(s.format(short=short) for s in settings))
    assert "Traceback" not in done.stderr, done.stderr
    assert done.returncode == 2, done.stderr
    lines = [line for line in done.stderr.splitlines() if " INFO " not in line]
    assert lines[0] == f"migratory: configuration error: {message.format(short=short)}", (
        done.stderr)
    if workers == "2":  # each worker says it; the supervisor says which stopped it
        assert lines[-1].endswith("stopped during start-up (exit code 2)"), done.stderr
    else:
        assert len(lines) == 1, done.stderr


@pytest.mark.parametrize(("where", "why"), [
    ("{tmp}/no-such-dir/audit.log", "No such file or directory"),
    ("{tmp}", "Is a directory"),
])
def test_an_audit_log_that_cannot_be_opened_names_the_key(
    tmp_path: Path, where: str, why: str
) -> None:
    """Before: 'migratory: No such file or directory', naming neither file nor key."""
    path = where.format(tmp=tmp_path)
    done = serve("Listen=127.0.0.1:0", "AuditAccess=true", f"AuditLogFile={path}")
    assert done.returncode == 1, done.stderr
    assert done.stderr.splitlines()[-1:] == [f"migratory: AuditLogFile {path}: {why}"], (
        done.stderr)


class _Writes:
    """A stderr that keeps each ``write`` apart, as an unbuffered pipe does."""

    def __init__(self) -> None:
        self.writes: list[str] = []

    def write(self, text: str) -> int:
        self.writes.append(text)
        return len(text)

    def flush(self) -> None:
        pass


def test_a_refusal_is_one_write_so_workers_lines_do_not_run_together(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """``Workers = 2`` refusing the same key: both workers write the line to the stream
    they share. ``print`` wrote the line and its newline apart under PYTHONUNBUFFERED (so
    this box, and CI): once in ~60 runs the two lines came out as one, ``...'here'migratory:
    configuration error: ...`` (the test above, Workers=2 with a Custom plugin, failed)."""
    from cluster import cli

    stderr = _Writes()
    monkeypatch.setattr(sys, "stderr", stderr)
    args = cli.build_parser(command="serve").parse_args(["serve", "--set", "NoSuchKey=1"])
    assert cli._serve(args) == 2
    assert len(stderr.writes) == 1, stderr.writes
    assert stderr.writes[0].startswith("migratory: configuration error: ")
    assert stderr.writes[0].endswith("\n") and stderr.writes[0].count("\n") == 1
