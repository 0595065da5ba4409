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
