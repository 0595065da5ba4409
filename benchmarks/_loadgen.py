"""Shared pieces of the load generators: the server under test, raw WebSocket clients, /proc.

Nothing here uses asyncio, trio or a WebSocket library on the load side: the
clients are plain non-blocking sockets driven by ``select.epoll``, so that a
load process spends its CPU on ``recv`` and a few byte operations per frame.
The HTTP handshake and the (rare) client frames reuse the project's sans-I/O
codec; the hot paths in the benchmarks walk frame headers themselves.

Every loop here is bounded by a deadline (``time.monotonic``) and by the
number of connections it handles.
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import json
import multiprocessing as mp
import multiprocessing.connection as mpc
import os
import re
import resource
import select
import signal
import socket
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from migratory.protocol.http import check_handshake_response, handshake_request, new_websocket_key
from migratory.protocol.websocket import encode_masked_binary

REPO = Path(__file__).resolve().parent.parent
RESULTS_DIR = REPO / "benchmarks" / "results"
CLK_TCK = os.sysconf("SC_CLK_TCK")
PAGE_KIB = os.sysconf("SC_PAGE_SIZE") // 1024

OPCODE_CLOSE = 0x8
RECV_SIZE = 32768  # below malloc's mmap threshold: a 256 KiB recv buffer costs an mmap per call
_READY_LINE = re.compile(r"^listening ws://(\[[^\]]+\]|[^:\s]+):(\d+)\s*$", re.MULTILINE)


# --- limits and /proc ---------------------------------------------------------------------


def raise_nofile() -> int:
    """Raise this process's soft RLIMIT_NOFILE to its hard limit; return the soft limit."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    target = hard if hard != resource.RLIM_INFINITY else 1 << 20
    if soft < target:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
            soft = target
        except (ValueError, OSError):
            pass
    return soft


_PR_SET_PDEATHSIG = 1


def die_with_parent(signum: int = signal.SIGTERM) -> None:
    """Ask Linux to send ``signum`` to this process when its parent dies (prctl PDEATHSIG).

    So a benchmark killed with SIGKILL leaves no server or load process behind.
    """
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, int(signum), 0, 0, 0)


def handle_sigterm() -> None:
    """Turn SIGTERM into SystemExit in the benchmark process, so its cleanup still runs."""

    def stop(signum: int, _frame: object) -> None:
        raise SystemExit(128 + signum)

    signal.signal(signal.SIGTERM, stop)


def cpu_seconds(pid: int) -> float:
    """utime + stime of ``pid`` (all its threads), in seconds; 0.0 if it is gone."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            stat = f.read()
    except OSError:
        return 0.0
    fields = stat[stat.rindex(b")") + 2 :].split()
    # After "pid (comm) ": field 3 is state, so utime (14) and stime (15) are at 11 and 12.
    return (int(fields[11]) + int(fields[12])) / CLK_TCK


def rss_kib(pid: int) -> int:
    """VmRSS of ``pid`` in KiB (0 if it is gone)."""
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1])
    except OSError:
        pass
    return 0


def system_jiffies() -> list[int]:
    """The first line of /proc/stat: user nice system idle iowait irq softirq steal (jiffies)."""
    with open("/proc/stat") as f:
        return [int(v) for v in f.readline().split()[1:9]]


class CpuMeter:
    """CPU % of named processes, and of the whole machine, between start() and stop().

    Process figures are utime + stime from /proc/PID/stat. The machine figures
    come from /proc/stat; ``softirq`` is where the kernel accounts most of the
    loopback TCP work (it is charged to no process), ``other`` is what remains
    for processes not named here (e.g. other jobs on a shared box).
    """

    def __init__(self, pids: dict[str, int]) -> None:
        self.pids = pids
        self._start: dict[str, float] = {}
        self._sys: list[int] = []
        self._t0 = 0.0
        self.result: dict[str, float] = {}

    def start(self) -> None:
        self._t0 = time.monotonic()
        self._start = {name: cpu_seconds(pid) for name, pid in self.pids.items()}
        self._sys = system_jiffies()

    def add(self, name: str, pid: int, *, since_birth: bool = False) -> None:
        """Measure one more process from now on (or all its CPU, if it started after start())."""
        self.pids[name] = pid
        self._start[name] = 0.0 if since_birth else cpu_seconds(pid)

    def stop(self) -> dict[str, float]:
        wall = max(time.monotonic() - self._t0, 1e-9)
        now = system_jiffies()
        result = {
            name: 100.0 * (cpu_seconds(pid) - self._start[name]) / wall
            for name, pid in self.pids.items()
        }
        delta = [b - a for a, b in zip(self._sys, now, strict=True)]
        scale = 100.0 * (os.cpu_count() or 1) / max(sum(delta), 1)
        idle = delta[3] + delta[4]
        result["machine"] = scale * (sum(delta) - idle)
        result["softirq"] = scale * (delta[5] + delta[6])
        result["other"] = max(
            0.0, result["machine"] - result["softirq"] - sum(result[n] for n in self.pids)
        )
        result["wall_seconds"] = wall
        self.result = result
        return result


def machine_description() -> dict[str, str]:
    model = "?"
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    model = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    mem = "?"
    try:
        with open("/proc/meminfo") as f:
            mem = f"{int(f.readline().split()[1]) // 1024} MiB"
    except OSError:
        pass
    return {
        "nproc": str(os.cpu_count()),
        "cpu": model,
        "memory": mem,
        "python": sys.version.split()[0],
        "kernel": os.uname().release,
    }


# --- the server under test ----------------------------------------------------------------


class ServerProcess:
    """``python -m migratory serve`` on 127.0.0.1:<free port>, stdout+stderr to a log file.

    Started in its own session so a Ctrl-C in the terminal reaches only the
    benchmark, which then stops the server itself: SIGINT, then SIGKILL.
    """

    def __init__(self, name: str, settings: list[str], *, ready_timeout: float = 30.0) -> None:
        self.settings = list(settings)
        self.ready_timeout = ready_timeout
        RESULTS_DIR.mkdir(parents=True, exist_ok=True)
        stamp = time.strftime("%Y%m%d-%H%M%S")
        self.log_path = RESULTS_DIR / f"{name}-server-{stamp}-{os.getpid()}.log"
        self.proc: subprocess.Popen[bytes] | None = None
        self.host = "127.0.0.1"
        self.port = 0
        self.returncode: int | None = None

    @property
    def pid(self) -> int:
        assert self.proc is not None
        return self.proc.pid

    def command(self) -> list[str]:
        cmd = [sys.executable, "-m", "migratory", "serve", "--set", "Listen=127.0.0.1:0"]
        for setting in self.settings:
            cmd += ["--set", setting]
        return cmd

    def start(self) -> None:
        with open(self.log_path, "wb") as log:
            self.proc = subprocess.Popen(
                self.command(),
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                cwd=REPO,
                start_new_session=True,
                preexec_fn=lambda: die_with_parent(signal.SIGINT),
            )
        deadline = time.monotonic() + self.ready_timeout
        while time.monotonic() < deadline:
            match = _READY_LINE.search(self.log_path.read_text(errors="replace"))
            if match:
                self.host = match[1].strip("[]")
                self.port = int(match[2])
                return
            if self.proc.poll() is not None:
                break
            time.sleep(0.05)
        tail = self.log_tail()
        self.stop()
        raise RuntimeError(f"server did not start (log {self.log_path}):\n{tail}")

    def stop(self, timeout: float = 10.0) -> int | None:
        proc = self.proc
        if proc is None or self.returncode is not None:
            return self.returncode
        if proc.poll() is None:
            proc.send_signal(signal.SIGINT)
            try:
                proc.wait(timeout)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(5)
        self.returncode = proc.returncode
        return self.returncode

    def __enter__(self) -> ServerProcess:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def log_tail(self, lines: int = 20) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return ""

    def log_summary(self, keep: int = 8) -> dict[str, object]:
        """Counts of WARNING/ERROR/tracebacks in the log, a few examples, the 'stopped:' line."""
        counts: Counter[str] = Counter()
        examples: list[str] = []
        stopped = ""
        try:
            text = self.log_path.read_text(errors="replace")
        except OSError:
            text = ""
        for line in text.splitlines():
            kind = None
            if " WARNING " in line:
                kind = "warning"
            elif " ERROR " in line or " CRITICAL " in line:
                kind = "error"
            elif line.startswith("Traceback"):
                kind = "traceback"
            if kind:
                counts[kind] += 1
                if len(examples) < keep:
                    examples.append(line[:300])
            if "stopped:" in line:
                stopped = line.split("stopped:", 1)[1].strip()
        return {
            "log": str(self.log_path),
            "counts": dict(counts),
            "examples": examples,
            "stopped": stopped,
            "returncode": self.returncode,
        }


def server_stats(host: str, port: int, timeout: float = 5.0) -> dict | None:
    """The server's ``GET /stats`` counters, or None if it does not answer with JSON."""
    request = f"GET /stats HTTP/1.1\r\nHost: {host}:{port}\r\nConnection: close\r\n\r\n"
    chunks = []
    try:
        with socket.create_connection((host, port), timeout) as sock:
            sock.sendall(request.encode("ascii"))
            for _ in range(256):  # at most 16 MiB
                chunk = sock.recv(65536)
                if not chunk:
                    break
                chunks.append(chunk)
        head, _, body = b"".join(chunks).partition(b"\r\n\r\n")
        if not head.startswith(b"HTTP/1.1 200"):
            return None
        stats = json.loads(body)
    except (OSError, ValueError):
        return None
    return stats if isinstance(stats, dict) else None


# --- raw WebSocket clients ----------------------------------------------------------------


def walk_frames(data: bytes, pos: int = 0) -> tuple[list[tuple[int, int, int]], int]:
    """Complete server frames in ``data[pos:]`` as (opcode, payload start, payload end).

    Server frames are unmasked. Returns the frames and the offset where the
    first incomplete frame starts (== len(data) when everything was used).
    """
    frames = []
    n = len(data)
    while n - pos >= 2:
        length = data[pos + 1] & 0x7F
        start = pos + 2
        if length == 126:
            if n - pos < 4:
                break
            length = int.from_bytes(data[pos + 2 : pos + 4], "big")
            start = pos + 4
        elif length == 127:
            if n - pos < 10:
                break
            length = int.from_bytes(data[pos + 2 : pos + 10], "big")
            start = pos + 10
        end = start + length
        if end > n:
            break
        frames.append((data[pos] & 0x0F, start, end))
        pos = end
    return frames, pos


def close_code(data: bytes, start: int, end: int) -> int:
    """The code of a close frame's payload (1005 = none given)."""
    return int.from_bytes(data[start : start + 2], "big") if end - start >= 2 else 1005


@dataclass(slots=True, eq=False)
class RawConn:
    """One client socket and the little state a load process keeps for it."""

    index: int
    sock: socket.socket
    key: str = ""
    state: str = "connecting"
    buf: bytes = b""  # handshake bytes, then the start of an incomplete frame
    count: int = 0  # frames counted by the benchmark
    closed: str = ""  # why it ended ("" while open)
    setup_ns: int = 0  # monotonic_ns when the connection attempt started
    ready_ns: int = 0  # monotonic_ns when it saw the ready marker
    last: bytes = b""  # the last chunk received (to tell how the connection ended)


@dataclass
class SetupResult:
    ready: list[RawConn]
    failures: Counter[str] = field(default_factory=Counter)
    seconds: float = 0.0
    connect_ms_max: float = 0.0


def open_connections(
    host: str,
    port: int,
    indexes: range,
    frames_for: Callable[[int], bytes],
    *,
    ready_marker: bytes,
    timeout: float,
    window: int = 256,
) -> SetupResult:
    """Open one WebSocket per index, send its first frames, wait for ``ready_marker``.

    ``frames_for(index)`` gives the (masked) frames connection ``index`` sends
    right after the 101. A connection is ready once a server frame contains
    ``ready_marker`` (e.g. ``b"SUBSCRIBE_ALLOW"``); bytes after that frame
    stay in ``conn.buf``. At most ``window`` connections are in their
    handshake at once (so the listen backlog never overflows). Bounded by
    ``timeout`` seconds and by ``len(indexes)`` connections.
    """
    t0 = time.monotonic()
    deadline = t0 + timeout
    ep = select.epoll()
    live: dict[int, RawConn] = {}
    result = SetupResult(ready=[])
    todo = iter(indexes)
    exhausted = False
    host_header = f"{host}:{port}"

    def fail(conn: RawConn, why: str) -> None:
        result.failures[why] += 1
        conn.closed = why
        fd = conn.sock.fileno()
        live.pop(fd, None)
        with contextlib.suppress(OSError, ValueError):
            ep.unregister(fd)
        conn.sock.close()

    def start_more() -> bool:
        while len(live) < window:
            index = next(todo, None)
            if index is None:
                return True
            sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            sock.setblocking(False)
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            conn = RawConn(index, sock, setup_ns=time.monotonic_ns())
            code = sock.connect_ex((host, port))
            if code not in (0, errno.EINPROGRESS):
                result.failures[f"connect: {errno.errorcode.get(code, code)}"] += 1
                sock.close()
                continue
            live[sock.fileno()] = conn
            ep.register(sock.fileno(), select.EPOLLOUT)
        return False

    try:
        exhausted = start_more()
        while (live or not exhausted) and time.monotonic() < deadline:
            events = ep.poll(min(0.2, max(deadline - time.monotonic(), 0.0)))
            for fd, _mask in events:
                conn = live.get(fd)
                if conn is None:
                    continue
                if conn.state == "connecting":
                    err = conn.sock.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR)
                    if err:
                        fail(conn, f"connect: {errno.errorcode.get(err, err)}")
                        continue
                    conn.key = new_websocket_key()
                    conn.sock.send(handshake_request(host_header, "/", conn.key))
                    conn.state = "handshake"
                    ep.modify(fd, select.EPOLLIN)
                    continue
                try:
                    data = conn.sock.recv(65536)
                except BlockingIOError:
                    continue
                except OSError as exc:
                    fail(conn, f"{conn.state}: {exc.strerror}")
                    continue
                if not data:
                    fail(conn, f"{conn.state}: connection closed by server")
                    continue
                data = conn.buf + data
                conn.buf = b""
                if conn.state == "handshake":
                    try:
                        used = check_handshake_response(data, conn.key)
                    except Exception as exc:  # HttpError: the server refused
                        fail(conn, f"handshake: {exc}")
                        continue
                    if used is None:
                        conn.buf = data
                        continue
                    conn.sock.send(frames_for(conn.index))
                    conn.state = "ops"
                    data = data[used:]
                frames, rest = walk_frames(data)
                for opcode, start, end in frames:
                    if opcode == OPCODE_CLOSE:
                        fail(conn, f"closed by server with {close_code(data, start, end)}")
                        break
                    if data.find(ready_marker, start, end) >= 0:
                        conn.state = "ready"
                        conn.ready_ns = time.monotonic_ns()
                        conn.buf = data[end:]
                        del live[fd]
                        ep.unregister(fd)
                        result.ready.append(conn)
                        break
                else:
                    conn.buf = data[rest:]
            if not exhausted:
                exhausted = start_more()
        for conn in list(live.values()):
            fail(conn, f"timeout in {conn.state}")
        if not exhausted:
            result.failures["not attempted (timeout)"] += sum(1 for _ in todo)
    finally:
        ep.close()
    result.seconds = time.monotonic() - t0
    if result.ready:
        result.connect_ms_max = max(c.ready_ns - c.setup_ns for c in result.ready) / 1e6
    return result


def masked(payload: bytes) -> bytes:
    """One masked binary frame with a fresh random mask."""
    return encode_masked_binary(payload, os.urandom(4))


def close_all(conns: list[RawConn]) -> None:
    for conn in conns:
        with contextlib.suppress(OSError):
            conn.sock.close()


# --- histograms -----------------------------------------------------------------------------

BUCKET_NS = 100_000  # 0.1 ms
BUCKETS = 100_000  # up to 10 s; the last bucket holds everything slower


def percentiles_ms(hist: list[int], qs: tuple[float, ...]) -> dict[str, float]:
    """Upper edges (ms) of the buckets where the cumulative count passes each quantile."""
    total = sum(hist)
    out: dict[str, float] = {}
    if not total:
        return {f"p{q * 100:g}": float("nan") for q in qs}
    targets = sorted((q * total, q) for q in qs)
    cum = 0
    t = 0
    for bucket, n in enumerate(hist):
        if not n:
            continue
        cum += n
        while t < len(targets) and cum >= targets[t][0]:
            out[f"p{targets[t][1] * 100:g}"] = (bucket + 1) * BUCKET_NS / 1e6
            t += 1
        if t == len(targets):
            break
    return out


def merge_hist(hists: list[list[int]]) -> list[int]:
    merged = [0] * BUCKETS
    for hist in hists:
        for i, n in enumerate(hist):
            if n:
                merged[i] += n
    return merged


def sparse(hist: list[int]) -> dict[int, int]:
    return {i: n for i, n in enumerate(hist) if n}


def dense(pairs: dict[int, int]) -> list[int]:
    hist = [0] * BUCKETS
    for i, n in pairs.items():
        hist[i] += n
    return hist


# --- load processes ---------------------------------------------------------------------------


def receive(pipes: list[mpc.Connection], kind: str, timeout: float) -> list[tuple]:
    """One message of ``kind`` from every pipe, within ``timeout`` seconds overall."""
    deadline = time.monotonic() + timeout
    index = {id(pipe): i for i, pipe in enumerate(pipes)}
    got: dict[int, tuple] = {}
    while len(got) < len(pipes):
        left = deadline - time.monotonic()
        if left <= 0:
            raise TimeoutError(f"{len(pipes) - len(got)} load process(es) sent no {kind!r}")
        waiting = [pipe for i, pipe in enumerate(pipes) if i not in got]
        for pipe in mpc.wait(waiting, left):
            assert isinstance(pipe, mpc.Connection)
            i = index[id(pipe)]
            try:
                msg = pipe.recv()
            except EOFError:
                raise RuntimeError(f"load process {i} died before sending {kind!r}") from None
            if msg[0] != kind:
                raise RuntimeError(f"load process {i} sent {msg[0]!r}, expected {kind!r}")
            got[i] = msg
    return [got[i] for i in range(len(pipes))]


def split(total: int, parts: int) -> list[tuple[int, int]]:
    """(first index, count) of ``parts`` nearly equal shares of ``total``."""
    out = []
    first = 0
    for k in range(parts):
        count = total // parts + (1 if k < total % parts else 0)
        out.append((first, count))
        first += count
    return out


def stop_processes(procs: list[mp.process.BaseProcess]) -> None:
    """Terminate, then kill, the load processes still alive (by their own PIDs)."""
    for proc in procs:
        if proc.is_alive():
            proc.terminate()
            proc.join(3)
        if proc.is_alive():
            proc.kill()
            proc.join(3)


def run_with_server(
    kind: str,
    settings: list[str],
    run: Callable[[ServerProcess, list[mp.Process]], dict | None],
    report: Callable[[dict], None],
    json_path: str | None,
) -> int:
    """Start the server, run the benchmark, always stop everything, report.

    Exit status: 0 = PASS, 1 = FAIL, 2 = could not run.
    """
    handle_sigterm()
    server = ServerProcess(kind, settings)
    procs: list[mp.Process] = []
    result: dict | None = None
    try:
        server.start()
        print(
            f"server pid {server.pid} on {server.host}:{server.port}, log {server.log_path}",
            flush=True,
        )
        result = run(server, procs)
    except (KeyboardInterrupt, SystemExit):
        print("interrupted", file=sys.stderr)
    except (RuntimeError, TimeoutError) as exc:
        print(f"benchmark failed: {exc}", file=sys.stderr)
    finally:
        stop_processes(procs)
        server.stop()
    if result is None:
        print(f"server log: {server.log_path}\n{server.log_tail()}", file=sys.stderr)
        return 2
    result["server_log"] = server.log_summary()
    result["machine"] = machine_description()
    report(result)
    if json_path:
        with open(json_path, "w") as f:
            json.dump(result, f, indent=2, sort_keys=True)
    return 0 if result["pass"] else 1
