"""Shared pieces of the load generators: load processes, and the run around the server.

The pieces live by concept, and are re-exported here so a benchmark can keep
importing them from ``_loadgen``:

* :mod:`_procfs` -- RLIMIT_NOFILE, parent-death signal, SIGTERM, CPU and RSS
  from /proc (``CpuMeter``), the machine description;
* :mod:`_server_process` -- the server under test (``ServerProcess``) and its
  ``GET /stats``;
* :mod:`_wsraw` -- raw non-blocking WebSocket clients driven by ``select.epoll``
  (``open_connections``, ``walk_frames``, ``masked``);
* :mod:`_latency` -- 0.1 ms latency histograms and their percentiles.

What stays here: the parent's side of the load processes (collecting their
pipe messages, splitting the work, stopping them) and ``run_with_server``.

Every loop here is bounded by a deadline (``time.monotonic``) and by the
number of connections it handles.
"""

from __future__ import annotations

import json
import multiprocessing as mp
import multiprocessing.connection as mpc
import sys
import time
from collections.abc import Callable

from _latency import BUCKET_NS, BUCKETS, dense, merge_hist, percentiles_ms, sparse
from _procfs import (
    CLK_TCK,
    PAGE_KIB,
    CpuMeter,
    cpu_seconds,
    die_with_parent,
    handle_sigterm,
    machine_description,
    raise_nofile,
    rss_kib,
    system_jiffies,
)
from _server_process import REPO, RESULTS_DIR, ServerProcess, server_stats
from _wsraw import (
    OPCODE_CLOSE,
    RECV_SIZE,
    RawConn,
    SetupResult,
    close_all,
    close_code,
    masked,
    open_connections,
    walk_frames,
)

__all__ = [
    "BUCKETS",
    "BUCKET_NS",
    "CLK_TCK",
    "OPCODE_CLOSE",
    "PAGE_KIB",
    "RECV_SIZE",
    "REPO",
    "RESULTS_DIR",
    "CpuMeter",
    "RawConn",
    "ServerProcess",
    "SetupResult",
    "close_all",
    "close_code",
    "cpu_seconds",
    "dense",
    "die_with_parent",
    "handle_sigterm",
    "machine_description",
    "masked",
    "merge_hist",
    "open_connections",
    "percentiles_ms",
    "raise_nofile",
    "receive",
    "rss_kib",
    "run_with_server",
    "server_stats",
    "sparse",
    "split",
    "stop_processes",
    "system_jiffies",
    "walk_frames",
]


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
    # every load process connects from 127.0.0.1: lift the per-address and rate limits
    # (docs/security.md); later --set values still win
    unlimited = ["MaxConnectionsPerAddress=0", "MaxHandshakesPerAddress=0",
                 "MaxPublishesPerSecond=0"]
    server = ServerProcess(kind, [*unlimited, *settings])
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
