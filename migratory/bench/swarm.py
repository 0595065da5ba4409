"""The C subscriber swarm (``swarm.c``): the fan-out benchmark's subscribers at a few
hundred nanoseconds of CPU per delivery instead of the Python processes' microseconds.

The server under test and the load generator share the machine's cores, so what the
subscribers spend per delivery is taken from the server. ``swarm.c`` is the same
counter as ``subscriber.count_deliveries`` (raw sockets in one epoll, stamps found in
the byte stream and never decoded, the same 0.1 ms histogram) in C. The bytes each
connection sends are built here, by the code the Python subscribers use, so the wire
is the same; the binary is compiled once per source version into a cache directory.

``swarm_main`` is a subscriber process like ``subscriber_main``: the same arguments,
the same ``ready`` / ``finish`` / ``result`` messages on ``ctrl``. It runs the
binary and relays; the binary's PID goes with ``ready`` (a fifth item) so that its
CPU is measured with the subscribers'.
"""

from __future__ import annotations

import hashlib
import multiprocessing.connection as mpc
import os
import shutil
import signal
import subprocess
import tempfile
import time
from collections import Counter
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import IO, Any

from migratory.bench.mqttraw import first_packets
from migratory.bench.procfs import die_with_parent
from migratory.bench.sse import READY as SSE_READY
from migratory.bench.sse import stream_request
from migratory.bench.stamp import expected_for, subject_for
from migratory.bench.subscriber import first_frames
from migratory.protocol import mqtt
from migratory.protocol.http import handshake_request, new_websocket_key, websocket_accept

SOURCE = Path(__file__).with_name("swarm.c")
COMPILE = ["-std=gnu11", "-O2", "-Wall", "-Wextra"]
LIBS = ["-lssl", "-lcrypto"]
PACKAGES = "gcc libssl-dev"
OPENSSL_HEADER = "/usr/include/openssl/ssl.h"
SUBSCRIBE_ALLOW = b"SUBSCRIBE_ALLOW"
# CONNACK accepted (no session present), then the SUBACK of packet 1 granting QoS 0
MQTT_READY = bytes((mqtt.CONNACK << 4, 2, 0, 0, mqtt.SUBACK << 4, 3, 0, 1, 0))

Step = tuple[bytes, bytes]  # bytes to send, then the marker to wait for


class SwarmUnavailable(RuntimeError):
    """The C swarm cannot be built here (the message says why and what to install)."""


def cache_dir() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "migratory"


def build(compiler: str | None = None) -> Path:
    """The swarm binary for this source, compiled now if it is not in the cache yet."""
    cc = compiler or os.environ.get("CC") or "cc"
    source = SOURCE.read_bytes()
    key = hashlib.sha256(source + " ".join([cc, *COMPILE, *LIBS]).encode()).hexdigest()[:16]
    binary = cache_dir() / f"swarm-{key}"
    if binary.exists():
        return binary
    if shutil.which(cc) is None:
        raise SwarmUnavailable(f"no C compiler ({cc}): apt-get install {PACKAGES}")
    binary.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=binary.parent, prefix=".swarm-")
    os.close(fd)
    try:
        done = subprocess.run([cc, *COMPILE, "-o", tmp, str(SOURCE), *LIBS],
                              capture_output=True, text=True, timeout=120)
        if done.returncode != 0:
            missing = "openssl/ssl.h" in done.stderr or not os.path.exists(OPENSSL_HEADER)
            hint = f"OpenSSL headers missing: apt-get install {PACKAGES}" if missing else (
                f"apt-get install {PACKAGES}?")
            first = done.stderr.strip().splitlines()[:3]
            raise SwarmUnavailable(f"cannot build swarm.c ({hint}): {' / '.join(first)}")
        os.replace(tmp, binary)  # atomic: concurrent builds end with one good file
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
    for old in binary.parent.glob("swarm-*"):  # earlier versions' binaries
        if old != binary:
            old.unlink(missing_ok=True)
    return binary


def native_steps(host: str, port: int, index: int, subjects: int) -> list[Step]:
    """The WebSocket upgrade (ready at its Sec-WebSocket-Accept), then ``connect`` and
    ``subscribe`` (ready at SUBSCRIBE_ALLOW), as ``wsraw.open_connections`` sends them."""
    key = new_websocket_key()
    upgrade = handshake_request(f"{host}:{port}", "/", key)
    return [(upgrade, websocket_accept(key).encode()),
            (first_frames(index, subjects), SUBSCRIBE_ALLOW)]


def sse_steps(host: str, port: int, index: int, subjects: int) -> list[Step]:
    """``GET /events?subject=…``, ready at its ``subscribe`` event (a whole line)."""
    return [(stream_request(host, subject_for(index, subjects)), SSE_READY + b"\n")]


def mqtt_steps(host: str, port: int, index: int, subjects: int) -> list[Step]:
    """CONNECT + SUBSCRIBE, ready at the accepted CONNACK and the SUBACK (QoS 0)."""
    return [(first_packets(index, subjects), MQTT_READY)]


STEPS: dict[str, Callable[[str, int, int, int], list[Step]]] = {
    "native": native_steps, "sse": sse_steps, "mqtt": mqtt_steps,
}


def _hex(data: bytes) -> str:
    return data.hex() or "-"


class Swarm:
    """One running swarm binary: configured, then ``ready``, then ``finish``."""

    def __init__(self, binary: Path, host: str, port: int, *, subjects: int,
                 setup_timeout: float, lifetime: float, ca_file: str | None = None,
                 window: int = 256) -> None:
        self.conf = (f"conf {host} {port} {subjects} {setup_timeout} {lifetime} "
                     f"{ca_file or '-'} {window}\n")
        self.binary = binary
        self.subjects = subjects
        self.lifetime = lifetime
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self, conns: Sequence[tuple[int, list[Step]]]) -> None:
        """Start the binary with each connection's index and steps."""
        self.proc = subprocess.Popen([str(self.binary)], stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE)
        lines = [self.conf]
        for index, steps in conns:
            lines.append(f"conn {index} " + " ".join(f"{_hex(s)} {_hex(m)}" for s, m in steps)
                         + "\n")
        lines.append("go\n")
        self._stdin.write("".join(lines).encode())
        self._stdin.flush()

    @property
    def _stdin(self) -> IO[bytes]:
        assert self.proc is not None and self.proc.stdin is not None
        return self.proc.stdin

    def _lines(self, until: str) -> list[list[str]]:
        """Output lines (split once per field) up to the one starting with ``until``."""
        assert self.proc is not None and self.proc.stdout is not None
        out = []
        for raw in self.proc.stdout:
            words = raw.decode().rstrip("\n").split(" ", 2)
            out.append(words)
            if words[0] == until:
                return out
        code = self.proc.wait(10)
        raise RuntimeError(f"the C swarm exited ({code}) before {until!r}")

    def ready(self) -> tuple[int, dict[str, int], float]:
        """Subscribers ready, set-up failures by reason, seconds."""
        failures: Counter[str] = Counter()
        for words in self._lines("ready"):
            if words[0] == "failure":
                failures[" ".join(words[1:])] += 1
            elif words[0] == "ready":
                return int(words[1]), dict(failures), float(words[2])
        raise AssertionError("unreachable")

    def finish(self, sent: int, drain: float) -> dict[str, Any]:
        """Drain until every expected delivery or ``drain`` s; the result dict of
        ``count_deliveries`` (plus each subscriber's count, ``counts``)."""
        self._stdin.write(f"finish {sent} {drain}\n".encode())
        self._stdin.flush()
        stats: dict[str, int] = {}
        hist: dict[int, int] = {}
        counts: dict[int, int] = {}
        closes: Counter[str] = Counter()
        for words in self._lines("end"):
            if words[0] == "stat":
                stats[words[1]] = int(words[2])
            elif words[0] == "hist":
                hist[int(words[1])] = int(words[2])
            elif words[0] == "conn":
                counts[int(words[1])] = int(words[2])
            elif words[0] == "close":
                closes[" ".join(words[1:])] += 1
        self.stop()
        per_conn = Counter(n - expected_for(i, self.subjects, sent) for i, n in counts.items())
        return {"subscribers": len(counts), "received": stats["received"],
                "max_ns": stats["max_ns"], "hist": hist, "per_conn_delta": dict(per_conn),
                "closes": dict(closes), "recvs": stats["recvs"], "polls": stats["polls"],
                "counts": counts}

    def stop(self) -> None:
        if self.proc is None:
            return
        try:
            self.proc.wait(5)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(5)
        for pipe in (self.proc.stdin, self.proc.stdout):
            if pipe is not None:
                pipe.close()


def empty_result() -> dict[str, Any]:
    return {"subscribers": 0, "received": 0, "max_ns": 0, "hist": {}, "per_conn_delta": {},
            "closes": {}, "recvs": 0, "polls": 0}


def swarm_main(
    ctrl: mpc.Connection,
    host: str,
    port: int,
    first: int,
    count: int,
    setup_timeout: float,
    lifetime: float,
    subjects: int = 1,
    ca_file: str | None = None,
    *,
    front_end: str = "native",
    binary: Path | None = None,
) -> None:
    """As ``subscriber_main`` (and the SSE and MQTT ones), with the C swarm counting."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    die_with_parent()
    steps = STEPS[front_end]
    swarm = Swarm(binary or build(), host, port, subjects=subjects,
                  setup_timeout=setup_timeout, lifetime=lifetime, ca_file=ca_file)
    started = time.monotonic()
    try:
        swarm.start([(i, steps(host, port, i, subjects)) for i in range(first, first + count)])
        ready, failures, seconds = swarm.ready()
    except (OSError, RuntimeError) as exc:
        swarm.stop()
        ctrl.send(("ready", 0, {f"C swarm: {exc}": count}, time.monotonic() - started))
        _result_after_finish(ctrl, lifetime, None)
        return
    assert swarm.proc is not None
    ctrl.send(("ready", ready, failures, seconds, swarm.proc.pid))
    _result_after_finish(ctrl, lifetime, swarm)


def _result_after_finish(ctrl: mpc.Connection, lifetime: float, swarm: Swarm | None) -> None:
    """Wait for the parent's ``finish`` (within ``lifetime``), send the swarm's result."""
    result = empty_result()
    try:
        if ctrl.poll(lifetime):
            msg = ctrl.recv()
            if msg[0] == "finish" and swarm is not None:
                result = swarm.finish(msg[1], msg[2])
                del result["counts"]
    except (OSError, RuntimeError, EOFError) as exc:
        result["closes"] = {f"C swarm: {exc}": 1}
    finally:
        if swarm is not None:
            swarm.stop()
    ctrl.send(("result", result))
