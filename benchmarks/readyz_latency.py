#!/usr/bin/env python3
"""How long a kubelet's readiness probe waits for ``/readyz`` while the member is busy.

    .venv/bin/python benchmarks/readyz_latency.py [--connections 5000] [--subscribers 1000]

Starts one member (the k8s ConfigMap's per-address limits off, a monitoring listener),
and asks ``GET /readyz`` every 100 ms on the client port (where the StatefulSet's
readinessProbe asks) and on the monitoring port, with the probe's 2 s timeout, through
three phases: idle; a connection storm (``migratory bench idle``: N WebSocket sessions
opened at once, as after a member's drain); a fan-out (``migratory bench fanout``).
Prints each phase's answers: count, median, p99, max, and how many got no answer in 2 s.
/readyz itself is O(1) (the reason is kept up to date); what it waits for is the
member's event loop and accept queue.
"""

from __future__ import annotations

import argparse
import http.client
import socket
import statistics
import subprocess
import sys
import threading
import time

from migratory.bench.server_process import ServerProcess

TIMEOUT = 2.0  # deploy/k8s/statefulset.yaml readinessProbe.timeoutSeconds


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def ask(port: int) -> float | None:
    began = time.monotonic()
    try:
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=TIMEOUT)
        conn.request("GET", "/readyz")
        conn.getresponse().read()
        conn.close()
    except OSError:
        return None
    return time.monotonic() - began


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--connections", type=int, default=5000)
    parser.add_argument("--subscribers", type=int, default=1000)
    parser.add_argument("--rate", type=int, default=20000)
    args = parser.parse_args()
    monitor = free_port()
    server = ServerProcess("readyz", [
        f"MonitorListen=127.0.0.1:{monitor}", "MaxConnectionsPerAddress=0",
        "MaxHandshakesPerAddress=0", "MaxConnectionRatePerAddress=0"])
    server.start()
    url = f"ws://127.0.0.1:{server.port}"
    samples: dict[tuple[str, str], list[float | None]] = {}
    phase = ["idle"]
    stop = threading.Event()

    def probe() -> None:
        while not stop.is_set():
            for name, port in (("client", server.port), ("monitor", monitor)):
                samples.setdefault((phase[0], name), []).append(ask(port))
            time.sleep(0.1)

    prober = threading.Thread(target=probe, daemon=True)
    prober.start()
    bench = [sys.executable, "-m", "migratory.bench", "--url", url, "--no-progress"]
    try:
        time.sleep(3)
        phase[0] = f"storm of {args.connections} sessions"
        loads = [subprocess.run([*bench, "idle", "--connections", str(args.connections),
                                 "--hold", "3"], capture_output=True, text=True, timeout=300)]
        phase[0] = f"fan-out {args.subscribers} subscribers x {args.rate}/s"
        loads.append(subprocess.run([*bench, "fanout", "--subscribers", str(args.subscribers),
                                     "--rate", str(args.rate), "--duration", "10"],
                                    capture_output=True, text=True, timeout=300))
    finally:
        stop.set()
        prober.join()
        server.stop()
    for load in loads:  # what the load tool said it did
        print("\n".join((load.stdout + load.stderr).strip().splitlines()[-4:]))
    print(f"{'phase':42} {'port':8} {'n':>5} {'median ms':>9} {'p99 ms':>7} {'max ms':>7} "
          f"{'no answer':>9}")
    for (name, port), values in samples.items():
        answered = sorted(v * 1000 for v in values if v is not None)
        if not answered:
            continue
        p99 = answered[min(len(answered) - 1, int(len(answered) * 0.99))]
        print(f"{name:42} {port:8} {len(values):5} {statistics.median(answered):9.1f} "
              f"{p99:7.1f} {answered[-1]:7.1f} {values.count(None):9}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
