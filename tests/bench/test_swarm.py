"""The C subscriber swarm (migratory/bench/swarm.c, driven by swarm.py).

Against a real server on 127.0.0.1 (``migratory bench --swarm c``), every front end,
plain and TLS: every delivery counted once by every subscriber. Against a tiny fake
server that writes a stamped stream cut at awkward places (one byte at a time, inside
the marker, inside the digits): every stamp counted exactly once, and a duplicated
stamp shows as one subscriber one over.
"""

from __future__ import annotations

import itertools
import json
import os
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from migratory.bench.loadgen import local_server
from migratory.bench.server_process import ServerProcess
from migratory.bench.swarm import Swarm, SwarmUnavailable, build

SHORT = ["--duration", "1", "--drain", "3", "--setup-timeout", "15", "--procs", "2"]


def run_bench(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "migratory.bench", "fanout", *args],
                          capture_output=True, timeout=60, text=True, env=env)


def bench(*args: str, json_path: Path, env: dict[str, str] | None = None) -> dict[str, Any]:
    """``migratory bench fanout ARGS``: its one result (the run must pass)."""
    done = run_bench(*args, "--json", str(json_path), env=env)
    assert done.returncode == 0, f"{done.stdout}\n{done.stderr}"
    (result,) = json.loads(json_path.read_text())["results"]
    return result  # type: ignore[no-any-return]


def counted_exactly(result: dict[str, Any], subscribers: int, rate: int) -> None:
    assert result["published"]["sent"] == rate  # one second of publishing
    assert result["deliveries_received"] == result["deliveries_expected"] == subscribers * rate
    assert result["subscriber_counts_off"] == {}  # no subscriber short or over
    assert sum(result["hist"].values()) == subscribers * rate
    assert result["closes"] == {} and result["setup_failures"] == {}


@pytest.fixture(scope="module")
def server() -> Iterator[ServerProcess]:
    proc = local_server("tests-swarm", [], mqtt=True)
    proc.start()
    try:
        yield proc
    finally:
        proc.stop()


@pytest.mark.parametrize("front_end", ["native", "sse", "mqtt"])
def test_the_c_swarm_counts_every_delivery(
    server: ServerProcess, front_end: str, tmp_path: Path
) -> None:
    where = ["--url", f"ws://127.0.0.1:{server.port}"]
    if front_end == "mqtt":
        where += ["--mqtt", f"mqtt://127.0.0.1:{server.mqtt_port}"]
    result = bench(*where, "--front-end", front_end, "--swarm", "c", "--subscribers", "20",
                   "--rate", "200", *SHORT, json_path=tmp_path / "out.json")
    assert result["swarm"] == "c"
    counted_exactly(result, 20, 200)
    assert any(name.startswith("subscribers-c-") for name in result["cpu_percent"])


@pytest.mark.parametrize("front_end", ["native", "sse", "mqtt"])
def test_the_c_swarm_over_tls(front_end: str, tmp_path: Path) -> None:
    result = bench("--front-end", front_end, "--tls", "--swarm", "c", "--subscribers", "10",
                   "--rate", "200", *SHORT, json_path=tmp_path / "out.json")
    assert result["swarm"] == "c"
    counted_exactly(result, 10, 200)


def test_without_a_compiler_the_python_subscribers_count(
    server: ServerProcess, tmp_path: Path
) -> None:
    """The default falls back to the Python subscribers, saying why; ``--swarm c`` fails."""
    env = {**os.environ, "CC": str(tmp_path / "no-cc"), "XDG_CACHE_HOME": str(tmp_path)}
    url = f"ws://127.0.0.1:{server.port}"
    refused = run_bench("--url", url, "--swarm", "c", env=env)
    assert refused.returncode == 2 and "apt-get install gcc libssl-dev" in refused.stderr
    json_path = tmp_path / "out.json"
    done = run_bench("--url", url, "--subscribers", "10", "--rate", "100", *SHORT,
                     "--json", str(json_path), env=env)
    assert done.returncode == 0, done.stderr
    assert "Python subscribers, the C swarm is unavailable" in done.stderr
    (result,) = json.loads(json_path.read_text())["results"]
    assert result["swarm"] == "python"
    counted_exactly(result, 10, 100)


def test_missing_openssl_headers_are_named(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A compiler that cannot find openssl/ssl.h: the error says what to install, and
    nothing is left in the cache."""
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    cc = tmp_path / "cc"
    cc.write_text("#!/bin/sh\necho 'swarm.c:1: fatal error: openssl/ssl.h: No such file' >&2\n"
                  "exit 1\n")
    cc.chmod(0o755)
    with pytest.raises(SwarmUnavailable, match="OpenSSL headers missing: apt-get install gcc "
                       "libssl-dev"):
        build(str(cc))
    assert list((tmp_path / "migratory").iterdir()) == []


# --- a fake server: the stamped stream cut where it hurts ---------------------------

BASE = time.monotonic_ns()


def stamp(k: int) -> bytes:
    return b"@@TS%019d" % (BASE + k)


def awkward_pieces(stamps: list[bytes]) -> list[bytes]:
    """The stream (each stamp in some frame-like bytes, '@' padding as a trap) cut
    inside stamp k at offset k (inside '@@TS', inside the digits, at its end), and the
    last stamp sent one byte at a time."""
    pieces: list[bytes] = []
    for k, one in enumerate(stamps[:-1]):
        cut = k % (len(one) + 1)
        pieces += [b"\x82\x7e\x00\x64@" + one[:cut], one[cut:] + b"@" * 5 + b"x" * 7]
    pieces += [b"@"] + [bytes((c,)) for c in stamps[-1]] + [b"@@T"]
    return pieces


def serve(
    listener: socket.socket, streams: list[list[bytes]], ending: bytes, glued: int = 0
) -> None:
    """Accept one connection per stream; after its b"HELLO" answer READY (and the first
    ``glued`` pieces in the same write), then write the pieces one by one, then
    ``ending``, then close."""
    conns = []
    for _ in streams:
        conn, _addr = listener.accept()
        conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        conn.settimeout(10)
        got = b""
        while b"HELLO" not in got:
            got += conn.recv(100) or b"HELLO"
        conn.sendall(b"..READY" + b"".join(streams[len(conns)][:glued]))
        conns.append(conn)
    # interleaved: every connection at once
    for pieces in itertools.zip_longest(*(stream[glued:] for stream in streams)):
        for conn, piece in zip(conns, pieces, strict=True):
            if piece:
                conn.sendall(piece)
        time.sleep(0.004)
    for conn in conns:
        conn.sendall(ending)
        conn.close()


def run_fake(
    streams: list[list[bytes]], sent: int, ending: bytes = b"", glued: int = 0
) -> dict[str, Any]:
    listener = socket.create_server(("127.0.0.1", 0))
    port = listener.getsockname()[1]
    writer = threading.Thread(target=serve, args=(listener, streams, ending, glued),
                              daemon=True)
    writer.start()
    swarm = Swarm(build(), "127.0.0.1", port, subjects=1, setup_timeout=10, lifetime=30)
    try:
        swarm.start([(i, [(b"HELLO", b"READY")]) for i in range(len(streams))])
        ready, failures, _seconds = swarm.ready()
        assert (ready, failures) == (len(streams), {})
        writer.join(20)
        assert not writer.is_alive()
        time.sleep(0.5)  # the swarm reads it all before it is told how many were sent
        return swarm.finish(sent, 2.0)
    finally:
        swarm.stop()
        listener.close()


def test_a_stamp_cut_anywhere_is_counted_once() -> None:
    stamps = [stamp(k) for k in range(25)]
    result = run_fake([awkward_pieces(stamps)] * 3, sent=25, ending=b"\x88\x02\x03\xe8")
    assert result["counts"] == {0: 25, 1: 25, 2: 25}
    assert result["received"] == 75 and sum(result["hist"].values()) == 75
    assert result["per_conn_delta"] == {0: 3}
    assert result["closes"] == {"close frame 1000": 3}  # the close frame, seen in the tail


def test_stamps_read_with_the_ready_marker_are_counted_and_timed() -> None:
    """Stamps in the same read as the last set-up marker. Before: counted for their
    subscriber but not in ``received`` or the histogram (CI: 72 == 75, when the fake
    server's first stamps came before the swarm had left its set-up)."""
    stamps = [stamp(k) for k in range(12)]
    result = run_fake([awkward_pieces(stamps)] * 2, sent=12, glued=7)
    assert result["counts"] == {0: 12, 1: 12}
    assert result["received"] == 24 and sum(result["hist"].values()) == 24


def test_a_duplicated_stamp_shows_as_one_over() -> None:
    """The planted failure: the same stamp twice on one connection is counted twice."""
    stamps = [stamp(k) for k in range(10)]
    doubled = [*stamps[:4], stamps[3], *stamps[4:]]
    result = run_fake([awkward_pieces(stamps), awkward_pieces(doubled)], sent=10)
    assert result["per_conn_delta"] == {0: 1, 1: 1}
    assert result["counts"] == {0: 10, 1: 11}
    assert result["closes"] == {"closed without close frame": 2}
