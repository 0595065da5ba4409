"""Other brokers to measure beside migratory: mosquitto and nats-server (its MQTT front end).

Each runs from its Debian package's binary on 127.0.0.1 with free ports and a
config file in a temporary folder, in its own session, and dies with the bench
(PDEATHSIG); it is stopped by its PID (SIGTERM, then SIGKILL).
"""

from __future__ import annotations

import shutil
import signal
import socket
import subprocess
import tempfile
import time
from pathlib import Path

from migratory.bench.procfs import die_with_parent
from migratory.bench.target import Target

BINARIES = {"mosquitto": ("mosquitto", "/usr/sbin/mosquitto"),
            "nats-server": ("nats-server", "/usr/sbin/nats-server")}


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def find_binary(name: str) -> str | None:
    command, fallback = BINARIES[name]
    found = shutil.which(command)
    return found or (fallback if Path(fallback).exists() else None)


class Broker:
    """One broker process on loopback; ``target`` once started."""

    def __init__(self, name: str, *, ready_timeout: float = 20.0) -> None:
        if name not in BINARIES:
            raise ValueError(f"unknown broker {name!r}: one of {', '.join(BINARIES)}")
        self.name = name
        self.ready_timeout = ready_timeout
        self.folder = Path(tempfile.mkdtemp(prefix=f"migratory-bench-{name}-"))
        self.log_path = self.folder / "broker.log"
        self.mqtt_port = free_port()
        self.proc: subprocess.Popen[bytes] | None = None

    def command(self, binary: str) -> list[str]:
        conf = self.folder / "broker.conf"
        if self.name == "mosquitto":
            conf.write_text(
                f"listener {self.mqtt_port} 127.0.0.1\nallow_anonymous true\n"
                "max_queued_messages 0\nmax_inflight_messages 0\n"
            )
            return [binary, "-c", str(conf)]
        conf.write_text(
            f"listen: 127.0.0.1:{free_port()}\nserver_name: bench\n"
            f"jetstream {{ store_dir: \"{self.folder / 'js'}\" }}\n"
            f"mqtt {{ listen: 127.0.0.1:{self.mqtt_port} }}\n"
        )
        return [binary, "-c", str(conf)]

    def start(self) -> Target:
        binary = find_binary(self.name)
        if binary is None:
            raise RuntimeError(f"{self.name} is not installed (apt-get install {self.name})")
        with open(self.log_path, "wb") as log:
            self.proc = subprocess.Popen(
                self.command(binary),
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
                preexec_fn=lambda: die_with_parent(signal.SIGTERM),
            )
        deadline = time.monotonic() + self.ready_timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                break
            try:
                socket.create_connection(("127.0.0.1", self.mqtt_port), 0.5).close()
            except OSError:
                time.sleep(0.05)
                continue
            return Target(self.name, "mqtt", "127.0.0.1", self.mqtt_port, pid=self.proc.pid)
        self.stop()
        raise RuntimeError(f"{self.name} did not start: {self.log_tail()}")

    def stop(self) -> None:
        proc = self.proc
        if proc is None or proc.poll() is not None:
            return
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(5)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(5)

    def log_tail(self, lines: int = 10) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return ""
