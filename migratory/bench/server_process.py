"""The server under test when the bench starts it: ``python -m cluster serve``, and /stats.

Its log goes to ``benchmarks/results/`` in a source checkout (a temporary folder
otherwise); it is stopped by PID (SIGINT, then SIGKILL), and dies with the
benchmark (PDEATHSIG).
"""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path
from typing import Any

from migratory.bench.procfs import die_with_parent

REPO = Path(__file__).resolve().parents[2]
RESULTS_DIR = (
    REPO / "benchmarks" / "results"
    if (REPO / "benchmarks").is_dir()
    else Path(tempfile.gettempdir()) / "migratory-bench"
)
_READY_LINE = re.compile(r"^listening ws://(\[[^\]]+\]|[^:\s]+):(\d+)\s*$", re.MULTILINE)
_MQTT_LINE = re.compile(r"^listening mqtt://(\[[^\]]+\]|[^:\s]+):(\d+)\s*$", re.MULTILINE)


class ServerProcess:
    """``python -m cluster serve`` on 127.0.0.1:<free port>, stdout+stderr to a log file.

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
        self.mqtt_port = 0  # with a ListenMqtt setting
        self.returncode: int | None = None

    @property
    def pid(self) -> int:
        assert self.proc is not None
        return self.proc.pid

    def command(self) -> list[str]:
        cmd = [sys.executable, "-m", "cluster", "serve", "--set", "Listen=127.0.0.1:0"]
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
                start_new_session=True,
                preexec_fn=lambda: die_with_parent(signal.SIGINT),
            )
        deadline = time.monotonic() + self.ready_timeout
        while time.monotonic() < deadline:
            text = self.log_path.read_text(errors="replace")
            match = _READY_LINE.search(text)
            wants_mqtt = any(s.startswith("ListenMqtt=") for s in self.settings)
            mqtt_match = _MQTT_LINE.search(text)
            if match and (mqtt_match or not wants_mqtt):
                self.host = match[1].strip("[]")
                self.port = int(match[2])
                self.mqtt_port = int(mqtt_match[2]) if mqtt_match else 0
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


def server_stats(host: str, port: int, timeout: float = 5.0) -> dict[str, Any] | None:
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
