"""What the stand-in's plays ask the members (their ``GET /cluster`` on the monitoring
port): the Raft leader, and how far behind each ready pod's hub is."""

from __future__ import annotations

import json

import trio
from k8s_local import LocalStatefulSet, http_body
from k8s_manifests import MONITOR_PORT


async def raft_leader(sts: LocalStatefulSet) -> int:
    """The ordinal of the seed the others follow (seed 0's view), or 0 if unknown."""
    status = json.loads(await http_body(sts.pods[0].ip, MONITOR_PORT, "/cluster"))
    leader = str(status.get("raft_leader") or "migratory-0.")
    return int(leader.split(".", 1)[0].rsplit("-", 1)[1])


async def current_leader(sts: LocalStatefulSet) -> int | None:
    """The ordinal of the Raft leader as the first ready seed that knows one says, None
    when none does (an election, every seed away)."""
    for _, pod in sorted(sts.pods.items()):
        if not pod.ready:
            continue
        try:
            leader = json.loads(await http_body(pod.ip, MONITOR_PORT, "/cluster")).get(
                "raft_leader")
        except ValueError:  # (no answer in time)
            continue
        if leader:
            return int(str(leader).split(".", 1)[0].rsplit("-", 1)[1])
    return None


async def follow_leader(sts: LocalStatefulSet, leader: list[int | None]) -> None:
    """Keep ``leader[0]`` at the Raft leader's ordinal (:func:`current_leader`, asked every
    0.25 s; the last one known meanwhile), for a Service port that prefers it: asked at
    each connection instead, a loaded pod slow to answer held the client's connect."""
    while True:
        known = await current_leader(sts)
        if known is not None:
            leader[0] = known
        await trio.sleep(0.25)


async def watch_lag(sts: LocalStatefulSet, lags: dict[str, int]) -> None:
    """Every second, each ready pod's applied clsn (its hub's copy of the committed stream):
    into ``lags``, the most batches each pod was ever behind the pod furthest ahead. A
    member's subscribers see the cluster that far back, and resume from there when it
    goes (past ``MaxCachedMessagesPerSubject`` messages of a subject: DATA_RESYNC)."""
    while True:
        applied: dict[str, int] = {}
        for pod in list(sts.pods.values()):
            if not pod.ready:
                continue
            try:
                clsn = json.loads(await http_body(pod.ip, MONITOR_PORT, "/cluster")).get(
                    "applied_clsn")
            except ValueError:  # (no answer in time)
                continue
            if isinstance(clsn, int):
                applied[pod.name] = clsn
        if applied:
            ahead = max(applied.values())
            for name, clsn in applied.items():
                lags[name] = max(lags.get(name, 0), ahead - clsn)
        await trio.sleep(1)
