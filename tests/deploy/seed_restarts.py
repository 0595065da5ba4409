"""Seed pods recreated one after another, each with a new IP: do the seeds link up again?

    unshare --net -- .venv/bin/python tests/deploy/seed_restarts.py --out DIR

(root: pods are network namespaces; see k8s_local.py). Starts the StatefulSet's seed
pods from the rendered install, then deletes and recreates each seed in reverse
ordinal order, as the rolling restart does (graceful deletion, the same name and
volume, a new IP), and measures after each recreation how long until every seed has
a Raft link to every other seed again (``raft_linked_seeds`` in ``/cluster``) and
every pod is ready. No clients: this is the rolling restart of the rehearsal
(rehearsal.py) alone. Writes ``summary.json`` into DIR.
"""

from __future__ import annotations

import argparse
import json
import secrets
import sys
from pathlib import Path

import trio
from k8s_local import LocalStatefulSet, http_body, raft_sockets
from k8s_manifests import MONITOR_PORT, documents, find

PATIENCE = 40.0
"""Seconds to wait for the seeds to link up after a recreation before giving up."""


async def linked_seeds(sts: LocalStatefulSet, seeds: list[int]) -> dict[str, list[str]]:
    """Each seed pod's Raft links, as its ``/cluster`` reports them."""
    links: dict[str, list[str]] = {}
    for ordinal in seeds:
        pod = sts.pods.get(ordinal)
        if pod is None:
            continue
        try:
            status = json.loads(await http_body(pod.ip, MONITOR_PORT, "/cluster"))
        except ValueError:
            status = {}
        links[pod.name] = list(status.get("raft_linked_seeds") or [])
    return links


async def wait_linked(sts: LocalStatefulSet, seeds: list[int], patience: float) -> float | None:
    """Seconds until every seed links to every other one, ``None`` after ``patience``."""
    began = trio.current_time()
    with trio.move_on_after(patience):
        while True:
            links = await linked_seeds(sts, seeds)
            if len(links) == len(seeds) and all(
                len(peers) == len(seeds) - 1 for peers in links.values()
            ):
                return round(trio.current_time() - began, 1)
            await trio.sleep(0.2)
    sts.events.note(f"seeds not linked after {patience} s: {await linked_seeds(sts, seeds)}")
    for pod in sts.pods.values():
        sts.events.note(f"{pod.name} at {pod.ip}, Raft connections: {raft_sockets(pod)}")
    return None


async def restart_seeds(out: Path, time_scale: float, patience: float) -> dict[str, object]:
    LocalStatefulSet.make_network()
    docs = documents()
    sts = LocalStatefulSet(docs, out / "pods", secrets.token_urlsafe(24), time_scale=time_scale)
    pdb = find(docs, "PodDisruptionBudget")["spec"]
    seeds = [int(v) for v in pdb["selector"]["matchExpressions"][0]["values"]]
    restarts: list[dict[str, object]] = []
    try:
        async with trio.open_nursery() as cluster:
            cluster.start_soon(sts.kubelet)
            for ordinal in seeds:  # Parallel: all at once
                await sts.create(ordinal)
            await sts.wait_ready(seeds, 60)
            first = await wait_linked(sts, seeds, patience)
            restarts.append({"pod": "first start", "linked_seconds": first})
            for ordinal in sorted(seeds, reverse=True):
                old_ip = sts.pods[ordinal].ip
                await sts.delete(ordinal)
                pod = await sts.create(ordinal)
                linked = await wait_linked(sts, seeds, patience)
                try:
                    began = trio.current_time()
                    await sts.wait_ready(seeds, patience)
                    ready: float | None = round(trio.current_time() - began, 1)
                except TimeoutError:
                    ready = None
                restarts.append({"pod": pod.name, "old_ip": old_ip, "ip": pod.ip,
                                 "linked_seconds": linked,
                                 "then_ready_seconds": ready})
            cluster.cancel_scope.cancel()
    finally:
        sts.stop_all()
    return {"restarts": restarts, "violations": sts.events.violations,
            "events": sts.events.log}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--time-scale", type=float, default=1.0,
                        help="multiply the manifest's probe periods, preStop and grace")
    parser.add_argument("--patience", type=float, default=PATIENCE)
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    summary = trio.run(restart_seeds, args.out, args.time_scale, args.patience)
    (args.out / "summary.json").write_text(json.dumps(summary, indent=2))
    print(json.dumps(summary["restarts"], indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
