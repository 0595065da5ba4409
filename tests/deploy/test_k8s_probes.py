"""The StatefulSet's probes against a member full of clients: the kubelet restarts a pod
whose liveness probe fails, so liveness (and startup) must be answered by a member that
is merely full (MaxConnections), which answers 503 to every newcomer on its client port.
The probes are read from the rendered install and asked of a real member process whose
listeners are laid out as the pod's config lays them (client port, monitoring port)."""

from __future__ import annotations

import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import trio
from k8s_manifests import documents, find, generated_secrets, load_pod_config, pod_view

from migratory_client import connect

DOCS = documents()
CONTAINER = find(DOCS, "StatefulSet")["spec"]["template"]["spec"]["containers"][0]


def status(url: str) -> int:
    try:
        with urllib.request.urlopen(url, timeout=5) as reply:
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
