"""Shared pieces of the cluster benchmarks: a 3-seed Guaranteed cluster on 127.0.0.1.

Members are real ``python -m cluster serve`` processes configured with
``cluster.tooling.member_settings``; each gets its own session and a
parent-death signal, its log goes to ``benchmarks/results/``, and every one is
stopped by PID (SIGTERM, then SIGKILL) at the end, also on errors.
Raw client connections: ``migratory.bench.wsraw`` (``open_raw``, ``publish_frame``,
``decode_frames``).
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))


from cluster.tooling import free_base_port, member_command, member_settings
from migratory.bench.procfs import die_with_parent
from migratory.bench.server_process import RESULTS_DIR

PASSWORD = "bench-cluster-password"


class BenchCluster:
    """A Guaranteed cluster of ``members`` processes (the first ``seeds`` are Raft seeds)."""

    def __init__(self, name: str, members: int = 3, seeds: int = 3, extra: dict | None = None,
                 launcher: list[str] | None = None):
        self.members = members
        # how a member is started; the experiment cluster_patched_member.py replaces it
        self.launcher = launcher or ["-m", "cluster"]
        self.base = free_base_port(members)
        stamp = time.strftime("%Y%m%d-%H%M%S")
        self.log_dir = RESULTS_DIR / f"{name}-{stamp}-{os.getpid()}"
        self.log_dir.mkdir(parents=True, exist_ok=True)
        self.settings = [
            {
                **member_settings(
                    i, members=members, seeds=seeds, mode="Guaranteed",
                    base_port=self.base, password=PASSWORD, data_dir=self.log_dir / "data",
                ),
                # the load comes from 127.0.0.1: no per-address or rate limits here
                "MaxConnectionsPerAddress": "0",
                "MaxHandshakesPerAddress": "0",
                "MaxConnectionRatePerAddress": "0",
                "MaxTlsHandshakeRate": "0",
                "MaxPublishesPerSecond": "0",
                **(extra or {}),
            }
            for i in range(members)
        ]
        self.procs: list[subprocess.Popen[bytes] | None] = [None] * members

    # --- processes ---------------------------------------------------------------------

    def start(self, i: int) -> None:
        # the password goes in the environment, never on a command line
        args, env = member_command(self.settings[i])
        args = [sys.executable, *self.launcher, *args[3:]]  # args[:3]: python -m cluster
        with (self.log_dir / f"migratory-{i}.log").open("ab") as log:
            self.procs[i] = subprocess.Popen(
                args, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=log, env=env,
                cwd=Path(__file__).resolve().parent.parent, start_new_session=True,
                preexec_fn=lambda: die_with_parent(signal.SIGKILL),
            )

    def start_all(self) -> None:
        for i in range(self.members):
            self.start(i)

    def pid(self, i: int) -> int:
        proc = self.procs[i]
        assert proc is not None
        return proc.pid

    def kill(self, i: int) -> int:
        """SIGKILL member ``i``; return monotonic_ns just before the signal."""
        proc = self.procs[i]
        assert proc is not None
        t = time.monotonic_ns()
        proc.send_signal(signal.SIGKILL)
        proc.wait(10)
        return t

    def stop(self, timeout: float = 10.0) -> None:
        live = [p for p in self.procs if p is not None and p.poll() is None]
        for p in live:
            with contextlib.suppress(OSError):
                p.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + timeout
        for p in live:
            try:
                p.wait(max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait(5)

    def __enter__(self) -> BenchCluster:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # --- HTTP ------------------------------------------------------------------------

    def port(self, i: int) -> int:
        return int(self.settings[i]["Listen"].rsplit(":", 1)[1])

    def http(self, i: int) -> str:
        return f"http://{self.settings[i]['Listen']}"

    def status(self, i: int) -> dict[str, Any]:
        with urllib.request.urlopen(f"{self.http(i)}/cluster", timeout=2) as reply:
            return json.loads(reply.read())

    def stats(self, i: int) -> dict[str, Any]:
        with urllib.request.urlopen(f"{self.http(i)}/stats", timeout=2) as reply:
            return json.loads(reply.read())

    def ready(self, i: int) -> bool:
        try:
            with urllib.request.urlopen(f"{self.http(i)}/readyz", timeout=2):
                return True
        except (OSError, urllib.error.URLError):
            return False

    def wait_ready(self, indexes: list[int] | None = None, timeout: float = 60) -> float:
        wanted = list(indexes if indexes is not None else range(self.members))
        t0 = time.monotonic()
        deadline = t0 + timeout
        while time.monotonic() < deadline:
            for i in wanted:
                p = self.procs[i]
                if p is not None and p.poll() is not None:
                    raise RuntimeError(f"member {i} exited: see {self.log_dir}")
            if all(self.ready(i) for i in wanted):
                return time.monotonic() - t0
            time.sleep(0.1)
        raise TimeoutError(f"members {wanted} not ready in {timeout} s (logs {self.log_dir})")

    def leader(self, timeout: float = 20) -> int:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            for i in range(self.members):
                p = self.procs[i]
                if p is None or p.poll() is not None:
                    continue
                with contextlib.suppress(OSError, ValueError):
                    if self.status(i).get("raft_state") == "leader":
                        return i
            time.sleep(0.1)
        raise RuntimeError("no Raft leader")

    def log_summary(self) -> dict[str, int]:
        counts = {"warning": 0, "error": 0, "critical": 0, "traceback": 0}
        for path in self.log_dir.glob("*.log"):
            for line in path.read_text(errors="replace").splitlines():
                if " WARNING " in line:
                    counts["warning"] += 1
                elif " CRITICAL " in line:
                    counts["critical"] += 1
                elif " ERROR " in line:
                    counts["error"] += 1
                elif line.startswith("Traceback"):
                    counts["traceback"] += 1
        return counts
