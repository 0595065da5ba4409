"""The StatefulSet's probes against a member full of clients: the kubelet restarts a pod
whose liveness probe fails, so liveness (and startup) must be answered by a member that
is merely full (MaxConnections), which answers 503 to every newcomer on its client port.
The probes are read from the rendered install and asked of a real member process whose
listeners are laid out as the pod's config lays them (client port, monitoring port)."""

from __future__ import annotations

import os
import signal
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import trio
from k8s_manifests import documents, find, generated_secrets, load_pod_config, pod_view
from kubelet_probes import ProbeState

from migratory_client import connect

DOCS = documents()
CONTAINER = find(DOCS, "StatefulSet")["spec"]["template"]["spec"]["containers"][0]


def status(url: str, timeout: float = 5) -> int:
    try:
        with urllib.request.urlopen(url, timeout=timeout) as reply:
            return int(reply.status)
    except urllib.error.HTTPError as exc:
        return exc.code
    except OSError:
        return 0


def probe_listener(probe: dict[str, Any], tmp_path: Path) -> str:
    """Which of the pod's listeners a probe asks: "client" or "monitor"."""
    config = load_pod_config(pod_view(DOCS, 3, generated_secrets("x")), tmp_path)
    port = probe["httpGet"]["port"]
    if isinstance(port, str):
        port = next(p["containerPort"] for p in CONTAINER["ports"] if p["name"] == port)
    if config.monitor_listen is not None and port == config.monitor_listen[1]:
        scheme = probe["httpGet"].get("scheme", "HTTP")
        assert scheme == ("HTTPS" if config.monitor_encrypted else "HTTP"), scheme
        return "monitor"
    assert port in {address[1] for address in config.listen}, port
    return "client"


def test_liveness_and_startup_answer_a_member_full_of_clients(
    start_server: Any, tmp_path: Path
) -> None:
    """Before, both probed /healthz on the client port: a full member answered them 503
    (so did readiness), and after ~70 s the kubelet would have restarted it -- a
    healthy member killed for being full, its clients then filling the others."""
    server = start_server(MaxConnections="2", MonitorListen="127.0.0.1:0")
    line = server.proc.stdout.readline().decode()
    assert line.startswith("monitoring http://"), line
    bases = {"client": server.url.replace("ws://", "http://"),
             "monitor": line.split(" ", 1)[1].strip()}
    answers: dict[str, int] = {}

    async def full() -> None:
        async with connect([server.url]) as one, connect([server.url]) as two:
            await one.wait_connected()
            await two.wait_connected()
            for kind in ("startupProbe", "livenessProbe", "readinessProbe"):
                probe = CONTAINER[kind]
                url = bases[probe_listener(probe, tmp_path)] + probe["httpGet"]["path"]
                answers[kind] = await trio.to_thread.run_sync(status, url)

    trio.run(full)
    assert answers["startupProbe"] == 200 and answers["livenessProbe"] == 200, answers
    # readiness on the client port: a full member leaves the Service until it has room
    assert answers["readinessProbe"] == 503, answers


SCALE = 0.25
"""The stall tests run the manifest's probe timings at a quarter (periods, timeouts and
the stalls alike): what counts is their ratios, not the wall time."""


def kubelet_readiness(url: str, pid: int, stall: float, window: float) -> list[bool]:
    """The manifest's readiness probe, asked of ``url`` every ``periodSeconds`` with its
    ``timeoutSeconds`` (both scaled), while the member's process is stopped for ``stall``
    seconds a period in: its event loop stalled (the kernel still accepts the probe's
    connection; the member answers once it runs again). The pod's readiness after each
    probe, as the kubelet counts it (``failureThreshold`` failures in a row)."""
    probe = CONTAINER["readinessProbe"]
    period = probe["periodSeconds"] * SCALE
    timeout = probe.get("timeoutSeconds", 1) * SCALE
    state = ProbeState.of(probe)
    states = []
    while not state.observe(status(url, timeout) == 200):  # ready first
        time.sleep(period)
    resume = threading.Timer(period + stall, os.kill, (pid, signal.SIGCONT))
    threading.Timer(period, os.kill, (pid, signal.SIGSTOP)).start()
    resume.start()
    try:
        began = time.monotonic()
        while time.monotonic() - began < window:
            tick = time.monotonic()
            states.append(state.observe(status(url, timeout) == 200))
            time.sleep(max(0.0, tick + period - time.monotonic()))
    finally:
        resume.join()
    return states


def test_an_event_loop_stall_of_seconds_keeps_the_pod_in_the_service(
    start_server: Any, tmp_path: Path
) -> None:
    """/readyz is answered by the member's event loop (on the client port: O(1), the
    readiness reason already kept), so a loop stopped for S seconds answers the probes of
    those S seconds only when it runs again. Before, the probe had ``failureThreshold: 1``
    and a 1 s timeout: a stall of just over 1 s (a seed loading a Raft dump shares the GIL
    1.1-1.2 s) took the pod out of the Service and restarted its ``minReadySeconds``
    (a rolling update waiting 30 s more). Now a 3 s stall keeps it ready; a member stalled
    for 12 s still leaves the Service (a hung member must not get clients), and comes
    back once it answers."""
    server = start_server()
    url = server.url.replace("ws://", "http://") + "/readyz"
    assert server.proc.poll() is None
    assert all(kubelet_readiness(url, server.proc.pid, 3 * SCALE, 6 * SCALE))
    hung = kubelet_readiness(url, server.proc.pid, 12 * SCALE, 18 * SCALE)
    assert not all(hung) and hung[-1], hung  # out of the Service, then back


def test_the_kubelet_model_counts_failures_in_a_row() -> None:
    state = ProbeState(failure_threshold=3)
    assert [state.observe(ok) for ok in (False, True, False, False, True, False, False,
                                         False, False, True)] == [
        False, True, True, True, True, True, True, False, False, True]
