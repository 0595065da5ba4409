"""How long a member's drain (SIGTERM) takes with many clients, against the pod's
``terminationGracePeriodSeconds`` (deploy/k8s: preStop 5 s + the drain within 60 s).

Starts one member with the k8s ConfigMap's DrainTime and per-address limits (off),
opens ``--connections`` idle WebSocket sessions (``migratory bench idle``: each closes
when told 4502 DRAINED, as an SDK does before it reconnects elsewhere), sends SIGTERM
and reports the seconds to the member's exit and its own "drained in" line.

    .venv/bin/python benchmarks/drain_clients.py --connections 10000
"""

from __future__ import annotations

import argparse
import json
import re
import signal
import subprocess
import sys
import time
import urllib.request

from migratory.bench.procfs import handle_sigterm, machine_description
from migratory.bench.server_process import ServerProcess

DRAINED = re.compile(r"drained in ([\d.]+) s: (\d+) clients told to reconnect elsewhere, "
                     r"(\d+) still connected")


def open_connections(metrics_url: str) -> int:
    with urllib.request.urlopen(metrics_url, timeout=5) as reply:
        for line in reply.read().decode().splitlines():
            if line.startswith("migratory_connections_open "):
                return int(float(line.split()[1]))
    return 0


def run(args: argparse.Namespace) -> dict[str, object]:
    monitor = 18_900 + (args.connections % 97)
    server = ServerProcess("drain-clients", [
        f"MonitorListen=127.0.0.1:{monitor}", f"DrainTime={args.drain_time}",
        "MaxConnectionsPerAddress=0", "MaxHandshakesPerAddress=0",
        "MaxConnectionRatePerAddress=0"])
    server.start()
    assert server.proc is not None
    idle = subprocess.Popen(
        [sys.executable, "-m", "migratory.bench", "idle", "--url",
         f"ws://127.0.0.1:{server.port}", "--pid", str(server.pid), "--connections",
         str(args.connections), "--hold", "600", "--no-progress"],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        metrics = f"http://127.0.0.1:{monitor}/metrics"
        deadline = time.monotonic() + 120
        while open_connections(metrics) < args.connections:
            assert time.monotonic() < deadline, "the sessions did not all open in 120 s"
            time.sleep(0.5)
        began = time.monotonic()
        server.proc.send_signal(signal.SIGTERM)
        code = server.proc.wait(args.drain_time + 30)
        exited = time.monotonic() - began
    finally:
        idle.send_signal(signal.SIGINT)
        try:
            idle.wait(30)
        except subprocess.TimeoutExpired:
            idle.kill()
        server.stop()
    log = server.log_path.read_text()
    found = DRAINED.findall(log)
    drain_lines = log[log.find("draining "):].splitlines() if "draining " in log else []
    return {
        "machine": machine_description(),
        "connections": args.connections,
        "sigterm_to_exit_s": round(exited, 2),
        "exit_code": code,
        "drained": [{"seconds": float(s), "told": int(t), "remaining": int(r)}
                    for s, t, r in found],
        # the member's log lines from "draining N clients" on (was one per client)
        "drain_log_lines": len(drain_lines),
        "summary": [line for line in drain_lines if "drained in" in line],
        "log": str(server.log_path),
    }


def main() -> None:
    handle_sigterm()
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--connections", type=int, default=10_000)
    parser.add_argument("--drain-time", type=int, default=45, help="DrainTime (the pod's)")
    print(json.dumps(run(parser.parse_args()), indent=2))


if __name__ == "__main__":
    main()
